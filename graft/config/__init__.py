"""The one configuration tree of graft.

A run is described by a YAML file whose keys mirror this tree, plus ``key=value`` overrides on the command line
(``update.clip_high=0.3 models.0.lr=2e-6``), or by the same dataclasses built in Python. Every field is documented
once, in the docstring under it, in the module of its section:

- :mod:`~graft.config.root` — :class:`Config`, the run as a whole and the invariants that span sections;
- :mod:`~graft.config.models`, :mod:`~graft.config.data`, :mod:`~graft.config.rollout`, :mod:`~graft.config.reward`,
  :mod:`~graft.config.exchange`, :mod:`~graft.config.update`, :mod:`~graft.config.saving`,
  :mod:`~graft.config.cluster` — one section each;
- :mod:`~graft.config.checks` — :class:`ConfigError` and :func:`~graft.config.checks.check`, how a section states an
  invariant; :mod:`~graft.config.coerce` — every value checked against its field's type hint;
  :mod:`~graft.config.keys` — dotted keys and did-you-mean; :mod:`~graft.config.show` — ``graft config show``;
  :mod:`~graft.config.load` — files, includes, overrides, presets; :mod:`~graft.config.upgrade` — keys of earlier
  versions.

Checks happen when the config is loaded, before anything is read or written: every value is checked against its
field's type hint (choices, int, float, bool, str, optional, list, dict, tuple), then ``__post_init__`` methods reject
broken invariants. Every :class:`ConfigError` message starts with the dotted field it is about
(``exchange.balance: 'MIN' is not one of min, none, asymmetric``; ``models.0.template: ...``), and a config with
several mistakes reports them all at once (:class:`ConfigErrors`). A config is a file or the name of a packaged one
(:func:`config_path`).

Defaults follow the paper (spec §3–§4) except where a field says otherwise; the embedded CPU job lives in
``configs/default.yaml``.
"""

from graft.config.checks import ConfigError, ConfigErrors
from graft.config.cluster import RayConfig, ResourceConfig
from graft.config.data import DataConfig
from graft.config.exchange import ExchangeConfig, PeerConfig
from graft.config.keys import field_hint, nearest_key
from graft.config.load import (
    CONFIGS,
    config_diff,
    config_path,
    load_config,
    packaged_configs,
    read_yaml_tree,
    run_success_threshold,
    save_config,
)
from graft.config.models import LoraConfig, ModelConfig
from graft.config.reward import RewardConfig, success_threshold_of
from graft.config.rollout import RolloutConfig
from graft.config.root import Config
from graft.config.saving import CheckpointConfig, EvalConfig, LoggingConfig
from graft.config.show import describe, field_docs, show_config, to_dict
from graft.config.update import UpdateConfig
from graft.config.upgrade import upgrade_tree

__all__ = [
    "CONFIGS",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "ConfigErrors",
    "DataConfig",
    "EvalConfig",
    "ExchangeConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "PeerConfig",
    "RayConfig",
    "ResourceConfig",
    "RewardConfig",
    "RolloutConfig",
    "UpdateConfig",
    "config_diff",
    "config_path",
    "describe",
    "field_docs",
    "field_hint",
    "load_config",
    "nearest_key",
    "packaged_configs",
    "read_yaml_tree",
    "run_success_threshold",
    "save_config",
    "show_config",
    "success_threshold_of",
    "to_dict",
    "upgrade_tree",
]
