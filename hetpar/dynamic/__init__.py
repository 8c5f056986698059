"""Dynamic clusters: event traces, cluster state over time, plan switching and replay."""

from hetpar.dynamic.adapters import SearchPlanner, SimThroughput, make_models
from hetpar.dynamic.cost import AnalyticThroughput, ThroughputModel
from hetpar.dynamic.planner import Planner, ShapePlanner
from hetpar.dynamic.policy import POLICIES, AdaptiveConfig
from hetpar.dynamic.replay import Replayer
from hetpar.dynamic.results import ReplayResult, Segment, Switch
from hetpar.dynamic.state import ClusterState, relocate, timeline
from hetpar.dynamic.switching import SwitchCost, SwitchSettings, switch_cost
from hetpar.dynamic.trace import Trace, TraceEvent, load_trace

__all__ = [
    "POLICIES", "AdaptiveConfig", "AnalyticThroughput", "ClusterState", "Planner",
    "ReplayResult", "Replayer", "SearchPlanner", "Segment", "ShapePlanner", "SimThroughput",
    "Switch", "SwitchCost", "SwitchSettings", "ThroughputModel", "Trace", "TraceEvent",
    "load_trace", "make_models", "relocate", "switch_cost", "timeline",
]
