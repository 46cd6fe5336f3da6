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
    helm.py cluster-install KUBECONFIG CHART NAMESPACE [--release NAME] [--set EXPR]...
        `helm install` into the API server KUBECONFIG names (releases kept as Secrets,
        Helm's default); prints {"manifest": text, "revision": number}
    helm.py cluster-upgrade KUBECONFIG CHART NAMESPACE [--release NAME]
            [--reuse-values | --reset-values | --reset-then-reuse-values]... [--set EXPR]...
        `helm upgrade` of that release to CHART with those flags, as Helm's CLI takes
        them; prints {"manifest": text, "revision": number}
    helm.py cluster-uninstall KUBECONFIG NAMESPACE [--release NAME]
        `helm uninstall` of that release (its pre-delete hooks run, Helm waits for
        them); prints {"release": the uninstalled release}
    helm.py cluster-test KUBECONFIG NAMESPACE [--release NAME]
        `helm test` of that release; prints {"release": the release with its hooks}
"""

import json
import sys

import helm_python as helm
from helm_python import _native

# helm upgrade's value modes, as the CLI spells them, and their option in Helm's SDK.
UPGRADE_MODES = {
    "--reuse-values": "reuse_values",
    "--reset-values": "reset_values",
    "--reset-then-reuse-values": "reset_then_reuse_values",
}


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
    elif len(argv) >= 4 and argv[0] == "cluster-install":
        kubeconfig, chart, namespace = argv[1], argv[2], argv[3]
        name, flags = release(argv[4:])
        with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
            rel = cfg.install(chart, name, values(flags), namespace=namespace)
        json.dump({"manifest": rel["manifest"], "revision": rel["revision"]}, sys.stdout)
    elif len(argv) >= 4 and argv[0] == "cluster-upgrade":
        kubeconfig, chart, namespace = argv[1], argv[2], argv[3]
        name, flags = release(argv[4:])
        modes = {UPGRADE_MODES[f]: True for f in flags if f in UPGRADE_MODES}
        flags = [f for f in flags if f not in UPGRADE_MODES]
        with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
            # The Python wrapper (0.2.2) passes reuse_values and reset_values but not
            # reset_then_reuse_values, which Helm's SDK underneath takes: the options
            # go to it directly, as the wrapper's own upgrade() sends them.
            handle, ref = cfg._chart_args(chart)
            payload = _native.call_string(
                "helm_upgrade",
                cfg._raw(),
                cfg._context_arg(None),
                handle,
                ref,
                name,
                json.dumps(values(flags)),
                json.dumps({"namespace": namespace, **modes}),
            )
        rel = json.loads(payload)
        json.dump({"manifest": rel["manifest"], "revision": rel["revision"]}, sys.stdout)
    elif len(argv) >= 3 and argv[0] == "cluster-uninstall":
        kubeconfig, namespace = argv[1], argv[2]
        name, _ = release(argv[3:])
        with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
            rel = cfg.uninstall(name, timeout=300)
        json.dump({"release": rel}, sys.stdout, default=str)
    elif len(argv) >= 3 and argv[0] == "cluster-test":
        kubeconfig, namespace = argv[1], argv[2]
        name, _ = release(argv[3:])
        with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
            rel = cfg.test(name, timeout=120)
        json.dump({"release": rel}, sys.stdout, default=str)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
