"""The planner: plan features, baselines, the learned cost model and AutoPlan.

A *plan* is how a fit runs: on the sources (factorized) or on the joined matrix
(materialized), on the CPU or a GPU. :class:`AutoPlan` predicts each plan's time
with a cost model (CatBoost over data, algorithm and hardware features, trained by
:func:`calibrate`; a roofline model where no trained model applies) and fits the
fastest. CatBoost is imported only when a model is loaded or trained.
"""

from ilargi_sklearn.planner._auto import (
    AutoPlan,
    clear_materialization_cache,
    clear_plan_history,
    materialized_dataset,
    set_materialization_cache,
)
from ilargi_sklearn.planner._calibrate import (
    CalibrationResult,
    balanced_schemas,
    calibrate,
    default_workloads,
)
from ilargi_sklearn.planner._cost_model import (
    CostModel,
    default_model_path,
    load_cost_model,
    read_records,
    shipped_model_path,
    train_cost_model,
)
from ilargi_sklearn.planner._features import (
    PLANS,
    data_features,
    model_inputs,
    plan_costs,
    plan_features,
)
from ilargi_sklearn.planner._hardware import cache_dir, hardware_info
from ilargi_sklearn.planner._heuristics import (
    BASELINES,
    always_factorize,
    always_materialize,
    amalur_rule,
    morpheus_rule,
)

__all__ = [
    "BASELINES",
    "PLANS",
    "AutoPlan",
    "CalibrationResult",
    "CostModel",
    "always_factorize",
    "always_materialize",
    "amalur_rule",
    "balanced_schemas",
    "cache_dir",
    "calibrate",
    "clear_materialization_cache",
    "clear_plan_history",
    "data_features",
    "default_model_path",
    "default_workloads",
    "hardware_info",
    "load_cost_model",
    "materialized_dataset",
    "model_inputs",
    "morpheus_rule",
    "plan_costs",
    "plan_features",
    "read_records",
    "set_materialization_cache",
    "shipped_model_path",
    "train_cost_model",
]
