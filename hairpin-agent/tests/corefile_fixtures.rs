//! Golden tests: the Corefiles distributions ship, with hairpin's rewrites applied.
//!
//! For each `tests/fixtures/corefiles/<name>.corefile` the result of `apply` must
//! equal `<name>.after`, removing it must give back the input byte for byte, and
//! applying twice must change nothing. Run with `HAIRPIN_BLESS=1` to rewrite the
//! `.after` files after an intended change, then review the diff.

use std::{fs, path::PathBuf};

use hairpin_agent::names::{
    corefile::{self, Rewrite},
    hostname::Hostname,
};

const TARGET: &str = "hairpin.hairpin-system.svc.cluster.local";
/// Every distribution in the fixtures directory; a missing one fails the test.
const DISTRIBUTIONS: [&str; 8] = [
    "aks",
    "digitalocean",
    "eks",
    "k3s",
    "kubeadm",
    "linode",
    "microk8s",
    "rke2",
];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corefiles")
}

fn rewrites() -> Vec<Rewrite> {
    let target = Hostname::parse(TARGET).expect("valid target");
    ["app.example.com", "*.apps.example.com", "API.example.com."]
        .into_iter()
        .map(|h| {
            Rewrite::new(Hostname::parse(h).expect("valid host"), target.clone())
                .expect("exact target")
        })
        .collect()
}

fn bless() -> bool {
    std::env::var_os("HAIRPIN_BLESS").is_some_and(|v| v == "1")
}

/// Compares `got` with the golden file, or rewrites the golden file when blessing.
fn check_golden(golden: &PathBuf, got: &str) {
    if bless() {
        fs::write(golden, got).unwrap_or_else(|e| panic!("writing {}: {e}", golden.display()));
        return;
    }
    let want = fs::read_to_string(golden).unwrap_or_else(|e| {
        panic!(
            "reading {} (run with HAIRPIN_BLESS=1 to create it): {e}",
            golden.display()
        )
    });
    assert_eq!(
        got,
        want,
        "{} differs from apply's output",
        golden.display()
    );
}

#[test]
fn every_distribution_has_a_fixture_and_nothing_else_is_there() {
    let mut found: Vec<String> = fs::read_dir(fixtures())
        .expect("fixtures directory")
        .filter_map(|e| {
            let name = e
                .expect("dir entry")
                .file_name()
                .into_string()
                .expect("utf-8 name");
            name.strip_suffix(".corefile").map(str::to_owned)
        })
        .collect();
    found.sort();
    assert_eq!(found, DISTRIBUTIONS);
}

#[test]
fn apply_matches_golden_and_remove_restores_the_original() {
    let rewrites = rewrites();
    for name in DISTRIBUTIONS {
        let input_path = fixtures().join(format!("{name}.corefile"));
        let input = fs::read_to_string(&input_path)
            .unwrap_or_else(|e| panic!("{}: {e}", input_path.display()));
        let applied = corefile::apply(&input, &rewrites).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_golden(&fixtures().join(format!("{name}.after")), &applied);

        assert_eq!(
            corefile::remove(&applied),
            input,
            "{name}: remove(apply(x)) != x"
        );
        assert_eq!(
            corefile::apply(&applied, &rewrites).unwrap(),
            applied,
            "{name}: apply is not idempotent"
        );
        assert_eq!(
            corefile::apply(&applied, &[]).unwrap(),
            input,
            "{name}: applying nothing must remove"
        );
        assert_eq!(applied.matches(corefile::MARKER).count(), 3, "{name}");

        // Changing the set replaces our lines and keeps the rest.
        let fewer = corefile::apply(&applied, &rewrites[..1]).unwrap();
        assert_eq!(fewer.matches(corefile::MARKER).count(), 1, "{name}");
        assert_eq!(corefile::remove(&fewer), input, "{name}");
    }
}

#[test]
fn import_file_matches_golden() {
    check_golden(
        &fixtures().join("hairpin.override.after"),
        &corefile::render_import(&rewrites()),
    );
}
