"""Helm v4, as a library, for the chart tests (tests/tests/deploy/chart.rs).

The PyPI wheel helm-python-sdk embeds Helm's Go SDK (no helm binary, no cluster);
`cargo xtask setup` installs a pinned version into a virtual environment under the
cache and `cargo xtask test` passes its interpreter as HAIRPIN_HELM_PYTHON.

    helm.py render CHART NAMESPACE [--release NAME] [--set EXPR | --set-json EXPR]...
        prints {"manifests": {template path: text}} as JSON, rendered as
        `helm install NAME CHART -n NAMESPACE --set ...` would (NAME hairpin unless
        given; values parsed by Helm's own strvals, merged in order over the chart's
        values.yaml and checked against its values.schema.json), hooks included
    helm.py install CHART NAMESPACE [--release NAME] [--set EXPR | --set-json EXPR]...
        prints {"manifest": text, "notes": text}: `helm install --dry-run=client`,
        whose manifest is what Helm installs as the release, hooks set apart
    helm.py lint CHART KUBE_VERSION [--set EXPR | --set-json EXPR]...
        prints Helm's lint report (strict: warnings count) as JSON
    helm.py package CHART DESTINATION
        packages the chart directory into DESTINATION; prints {"archive": path}
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


def release(flags):
    """The release name (--release NAME, first) and the remaining flags."""
    if flags[:1] == ["--release"] and len(flags) >= 2:
        return flags[1], flags[2:]
    return "hairpin", flags


def main(argv):
    if len(argv) >= 3 and argv[0] == "render":
        chart, namespace = argv[1], argv[2]
        name, flags = release(argv[3:])
        with helm.Chart.load(chart) as c:
            manifests = c.render(values(flags), name=name, namespace=namespace, is_install=True)
        json.dump({"helm": helm.helm_sdk_version(), "manifests": manifests}, sys.stdout)
    elif len(argv) >= 3 and argv[0] == "install":
        chart, namespace = argv[1], argv[2]
        name, flags = release(argv[3:])
        # No cluster: a client-side dry run stores nothing and contacts no API server
        # (the address below is never dialled).
        cfg = helm.Config(
            storage_driver="memory", kube_apiserver="http://127.0.0.1:9", namespace=namespace
        )
        with cfg:
            rel = cfg.install(chart, name, values(flags), namespace=namespace, dry_run="client")
        json.dump({"manifest": rel["manifest"], "notes": rel["notes"]}, sys.stdout)
    elif len(argv) == 3 and argv[0] == "package":
        json.dump({"archive": helm.package(argv[1], destination=argv[2])}, sys.stdout)
    elif len(argv) >= 3 and argv[0] == "lint":
        chart, kube_version = argv[1], argv[2]
        report = helm.lint(chart, values(argv[3:]), strict=True, kube_version=kube_version)
        json.dump(report, sys.stdout)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
