"""Offline memory planning: place buffers with known lifetimes in one arena, as small as possible.

    problem = read_problem("lifetimes.csv")        # id,lower,upper,size
    result = plan(problem, "search", time_limit=60)
    result.height, result.offsets
"""

from .placement import Plan, PlanError, validate
from .planner import ALGORITHMS, plan
from .problem import (PlanningProblem, ProblemFormatError, problem_from_arrays, problem_from_trace,
                      read_problem)

__all__ = ["ALGORITHMS", "Plan", "PlanError", "PlanningProblem", "ProblemFormatError",
           "plan", "problem_from_arrays", "problem_from_trace", "read_problem",
           "validate"]
