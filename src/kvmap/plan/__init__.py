"""Analytical capacity planner: KV bytes, sequences that fit, the longest context.

    from kvmap.plan import get_gpu, get_model, plan_capacity
    plan_capacity(get_model("llama-3-70b"), get_gpu("h100-80gb"), "int8",
                  num_gpus=4, context_tokens=32768).max_concurrent_seqs
"""
from kvmap.plan.catalogue import GPU, PlanModel, get_gpu, get_model
from kvmap.plan.planner import CapacityPlan, plan_capacity

__all__ = ["GPU", "CapacityPlan", "PlanModel", "get_gpu", "get_model", "plan_capacity"]
