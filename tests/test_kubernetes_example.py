"""``examples/kubernetes/pytorchjob.yaml``, checked statically (no cluster can run here).

Two checks. (1) The manifest validates against the part of the Kubeflow training
operator's published ``kubeflow.org/v1`` PyTorchJob schema that it uses (the CRD
``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``, 520 KB, is not vendored: the
fields below are transcribed from its openAPIV3Schema: int32 replica counts, the
restart-policy and rendezvous-backend enums, ``pytorch`` as the container the
operator drives). (2) What the pods run is a valid ``disttrain train`` command:
torchrun's flags, then arguments that disttrain's own config loader accepts, and the
elastic policy's replica bounds equal the replicas declared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with ray (requirements.lock)")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with ray")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "kubernetes"
INT32: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
REPLICA_SPEC = {
    "type": "object",
    "properties": {
        "replicas": INT32,
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["containers"],
                    "properties": {
                        "containers": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "command": {"type": "array", "items": {"type": "string"}},
                                    "args": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                            # the operator sets torchrun's environment in the container
                            # named pytorch
                            "contains": {"properties": {"name": {"const": "pytorch"}}},
                        }
                    },
                }
            },
        },
    },
    "additionalProperties": False,
}
SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"},
        "kind": {"const": "PyTorchJob"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["pytorchReplicaSpecs"],
            "properties": {
                "elasticPolicy": {
                    "type": "object",
                    "properties": {
                        "minReplicas": INT32,
                        "maxReplicas": INT32,
                        "maxRestarts": INT32,
                        "nProcPerNode": INT32,
                        "rdzvBackend": {"enum": ["c10d", "etcd", "etcd-v2"]},
                        "rdzvHost": {"type": "string"},
                        "rdzvPort": INT32,
                        "rdzvId": {"type": "string"},
                        "rdzvConf": {"type": "array"},
                        "standalone": {"type": "boolean"},
                        "metrics": {"type": "array"},
                    },
                    "additionalProperties": False,
                },
                "pytorchReplicaSpecs": {
                    "type": "object",
                    "propertyNames": {"enum": ["Master", "Worker"]},
                    "additionalProperties": REPLICA_SPEC,
                },
                "runPolicy": {"type": "object"},
            },
            "additionalProperties": False,
        },
    },
}


def _job() -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLE / "pytorchjob.yaml").read_text()))


def test_the_pytorchjob_validates_against_the_operators_schema() -> None:
    jsonschema.validate(_job(), SCHEMA)
    bad = _job()
    bad["spec"]["elasticPolicy"]["rdzvBackend"] = "static"  # the schema can fail
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_every_pod_runs_a_valid_disttrain_train_under_torchrun() -> None:
    from disttrain import config

    job = _job()
    specs = job["spec"]["pytorchReplicaSpecs"]
    policy = job["spec"]["elasticPolicy"]
    replicas = sum(s["replicas"] for s in specs.values())
    assert policy["rdzvBackend"] == "c10d"
    assert policy["minReplicas"] <= policy["maxReplicas"] == replicas
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        command, args = container["command"], container["args"]
        assert command[0] == "torchrun" and command[-3:] == ["-m", "disttrain", "train"]
        assert int(command[command.index("--nproc-per-node") + 1]) >= 1
        flags = dict(zip(args[::2], args[1::2], strict=True))
        settings = {k[2:].replace("-", "_"): v for k, v in flags.items()}
        fields = config.section_fields()
        typed = {k: type(fields[k][1].default)(v) for k, v in settings.items()}
        cfg = config.load(typed)  # unknown or invalid settings raise here
        assert cfg.train.out.startswith("/runs/")  # the shared volume: checkpoints of every pod
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/runs" in mounts


def test_the_container_recipe_installs_the_lock_without_resolving() -> None:
    text = (EXAMPLE / "Dockerfile").read_text()
    assert "COPY requirements.lock" in text
    assert "pip install --no-cache-dir --no-deps -r requirements.lock" in text
    assert 'python -c "import disttrain"' in text
