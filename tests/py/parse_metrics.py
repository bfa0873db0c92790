"""Parses OpenMetrics text (stdin) with the Prometheus project's own Python
parser, independent of the Rust encoder that wrote it, and prints the
families as JSON: {name: {"type": ..., "samples": [{"name", "labels",
"value"}]}}. A text the parser rejects is an error (exit 1)."""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

families = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    families[family.name] = {
        "type": family.type,
        "samples": [
            {"name": s.name, "labels": s.labels, "value": s.value}
            for s in family.samples
        ],
    }
json.dump(families, sys.stdout)
