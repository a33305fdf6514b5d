"""The exact analytical model: FLOPs, memory, communication and step time of a plan."""
from planner.analytical.estimate import RULES, Estimate, estimate, estimate_many, violated_rules
from planner.analytical.plans import PlanArrays

__all__ = ["RULES", "Estimate", "estimate", "estimate_many", "violated_rules", "PlanArrays"]
