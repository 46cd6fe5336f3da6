"""Helm v4, as a library, for the chart tests (tests/tests/deploy/chart.rs).

The PyPI wheel helm-python-sdk embeds Helm's Go SDK (no helm binary, no cluster);
`cargo xtask setup` installs a pinned version into a virtual environment under the
cache and `cargo xtask test` passes its interpreter as HAIRPIN_HELM_PYTHON.

    helm.py render CHART NAMESPACE [--set EXPR | --set-json EXPR]...
        prints {"manifests": {template path: text}} as JSON, rendered as
        `helm install hairpin CHART -n NAMESPACE --set ...` would (values parsed by
        Helm's own strvals, merged in order over the chart's values.yaml)
    helm.py lint CHART KUBE_VERSION [--set EXPR | --set-json EXPR]...
        prints Helm's lint report (strict: warnings count) as JSON
"""

import json
import sys

import helm_python as helm


def merge(into, new):
    """Helm's strvals.ParseInto: later --set flags add to (and override) earlier ones."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def values(flags):
    parsers = {"--set": helm.parse_set_string, "--set-json": helm.parse_set_json}
    out = {}
    if len(flags) % 2:
        sys.exit(f"helm.py: expected FLAG EXPR pairs, got {flags!r}")
    for flag, expr in zip(flags[0::2], flags[1::2]):
        if flag not in parsers:
            sys.exit(f"helm.py: unknown flag {flag!r} (--set, --set-json)")
        merge(out, parsers[flag](expr))
    return out


def main(argv):
    if len(argv) >= 3 and argv[0] == "render":
        chart, namespace = argv[1], argv[2]
        with helm.Chart.load(chart) as c:
            manifests = c.render(
                values(argv[3:]), name="hairpin", namespace=namespace, is_install=True
            )
        json.dump({"helm": helm.helm_sdk_version(), "manifests": manifests}, sys.stdout)
    elif len(argv) >= 3 and argv[0] == "lint":
        chart, kube_version = argv[1], argv[2]
        report = helm.lint(chart, values(argv[3:]), strict=True, kube_version=kube_version)
        json.dump(report, sys.stdout)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
