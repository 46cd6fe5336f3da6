//! Golden tests: the Corefiles distributions ship, with hairpin's rewrites applied.
//!
//! For each `tests/fixtures/corefiles/<name>.corefile` the result of `apply` must
//! equal `<name>.after`, removing it must give back the input byte for byte, and
//! applying twice must change nothing. Run with `HAIRPIN_BLESS=1` to rewrite the
//! `.after` files after an intended change, then review the diff. Besides the
//! distributions' Corefiles, `constructed-*` fixtures are written by hand for a case
//! no distribution ships by default (each says so in its first lines).

use std::{fs, path::PathBuf};

use hairpin_agent::names::{
    Hostname,
    corefile::{self, Rewrite},
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

/// Hand-written Corefiles for cases found in review, labelled `constructed-`.
const CONSTRUCTED: [&str; 1] = ["constructed-stub-domain-forward"];

/// Every fixture: the distributions, then the constructed ones.
fn all_fixtures() -> impl Iterator<Item = &'static str> {
    DISTRIBUTIONS.into_iter().chain(CONSTRUCTED)
}

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
    let mut want: Vec<&str> = all_fixtures().collect();
    want.sort();
    assert_eq!(found, want);
}

#[test]
fn apply_matches_golden_and_remove_restores_the_original() {
    let rewrites = rewrites();
    for name in all_fixtures() {
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

/// The constructed stub-domain case: ours go right after `.:53 {`, and the
/// stub block's nested `forward` block is byte for byte what it was.
#[test]
fn the_nested_forward_block_is_left_alone() {
    let name = "constructed-stub-domain-forward";
    let input = fs::read_to_string(fixtures().join(format!("{name}.corefile"))).expect("fixture");
    let applied = corefile::apply(&input, &rewrites()).expect("editable");
    let ours: Vec<usize> = applied
        .lines()
        .enumerate()
        .filter(|(_, l)| l.ends_with(corefile::MARKER))
        .map(|(i, _)| i)
        .collect();
    let lines: Vec<&str> = applied.lines().collect();
    assert_eq!(lines[ours[0] - 1], ".:53 {", "{applied}");
    assert!(
        applied.contains("    forward . 10.150.0.1 {\n        force_tcp\n    }\n}\n"),
        "{applied}"
    );
    // Cut the main block's closing brace: unbalanced, refused, nothing produced.
    let cut = input
        .trim_end()
        .strip_suffix('}')
        .expect("ends with the main block's brace");
    assert_eq!(
        corefile::apply(cut, &rewrites()),
        Err(corefile::CorefileError::UnclosedBlock { line: 19 })
    );
}

#[test]
fn import_file_matches_golden() {
    check_golden(
        &fixtures().join("hairpin.override.after"),
        &corefile::render_import(&rewrites()),
    );
}
