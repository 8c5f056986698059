"""The planner: searches a declared space of (heterogeneous) plans against a cost model."""

from hetpar.search.costmodel import CostModel, Evaluation, StageCost, StageKey, StateBytes
from hetpar.search.objectives import Objective
from hetpar.search.planner import Ranked, SearchResult, search
from hetpar.search.rules import SearchStats
from hetpar.search.space import SearchSpace, load_space

__all__ = [
    "CostModel",
    "Evaluation",
    "Objective",
    "Ranked",
    "SearchResult",
    "SearchSpace",
    "SearchStats",
    "StageCost",
    "StageKey",
    "StateBytes",
    "load_space",
    "search",
]
