"""The watched model as layerscope names it: what every other stage speaks of.

- the module tree and one step's call order (``ModuleInfo``, ``CallEvent``), and which modules
  a watch takes (``select``, ``unwrap``: regexes, predicates, module objects and types,
  inside DDP and compile);
- what can be recorded of a module (``Kind``);
- what a row of statistics is about, interned as small integers (``Identities``), and a
  flush's rows themselves (``StatsRows``), which the writer hands the health rules and sinks;
- a row of the attention table (``AttentionRow``): one head of one attention call;
- a table's or column's name as SQL text (``quote_identifier``), the one way readers put one
  into a query;
- the compact table a notebook shows for a run, a scope or a capture (``html_table``,
  ``run_table``).

Receives nothing and hands nothing on: the hooks, the writer, the store and the readers all
take their names from here. Reading a stored run imports this package without torch: the
names that need it (selection, rows of tensors) are imported when first used.
"""

from typing import TYPE_CHECKING

from layerscope._lazy import lazy_names
from layerscope.model._attention import ATTENTION_COLUMNS, AttentionRow
from layerscope.model._identifiers import quote_identifier
from layerscope.model._identities import (
    FORM_COLUMNS,
    IDENTITY_COLUMNS,
    KEY_COLUMNS,
    META_COLUMNS,
    SENTINEL_STATS,
    Form,
    Identities,
    Identity,
)
from layerscope.model._kinds import DEFAULT_KINDS, STATE_KINDS, Kind, parse_kinds
from layerscope.model._modules import CallEvent, ModuleInfo, clean_name, module_tree
from layerscope.model._notebook import alert_counts, html_table, run_table, unreadable

if TYPE_CHECKING:
    from layerscope.model._rows import StatsRows, join_columns
    from layerscope.model._rules import ModuleFilter, Rules, parse_rules
    from layerscope.model._select import Selection, check_types, device_type, select, selected
    from layerscope.model._wrappers import is_compiled, unwrap

__getattr__ = lazy_names(
    __name__,
    {
        "StatsRows": "layerscope.model._rows",
        "join_columns": "layerscope.model._rows",
        **dict.fromkeys(("ModuleFilter", "Rules", "parse_rules"), "layerscope.model._rules"),
        **dict.fromkeys(
            ("Selection", "check_types", "device_type", "select", "selected"),
            "layerscope.model._select",
        ),
        **dict.fromkeys(("is_compiled", "unwrap"), "layerscope.model._wrappers"),
    },
)

__all__ = [
    "ATTENTION_COLUMNS",
    "DEFAULT_KINDS",
    "FORM_COLUMNS",
    "IDENTITY_COLUMNS",
    "KEY_COLUMNS",
    "META_COLUMNS",
    "SENTINEL_STATS",
    "STATE_KINDS",
    "AttentionRow",
    "CallEvent",
    "Form",
    "Identities",
    "Identity",
    "Kind",
    "ModuleFilter",
    "ModuleInfo",
    "Rules",
    "Selection",
    "StatsRows",
    "alert_counts",
    "check_types",
    "clean_name",
    "device_type",
    "html_table",
    "is_compiled",
    "join_columns",
    "module_tree",
    "parse_kinds",
    "parse_rules",
    "quote_identifier",
    "run_table",
    "select",
    "selected",
    "unreadable",
    "unwrap",
]
