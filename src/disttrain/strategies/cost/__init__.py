"""Each strategy's cost part: its step time and memory in the α–β cost model (``advise``).

One module per strategy, named in its registration (``cost="disttrain.strategies.cost.zero:
ZeroCost"``) and imported only by the lab, pre-flight's memory plan and ``compare``
(:meth:`~disttrain.strategies.base.StrategyKind.cost_model`): a worker never imports
this package nor :mod:`disttrain.costing` (tests/strategies/test_kind.py checks it).
"""
