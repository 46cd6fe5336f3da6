//! Every `helm install` and `helm upgrade` the README and docs/ tell an operator to
//! type renders through the chart with the values it sets: values.schema.json
//! refuses a key that does not exist or a value of the wrong shape, so a doc that
//! names a removed or misspelt value fails here instead of on a cluster.

use std::path::Path;

use hairpin_tests::repo::workspace;

use super::chart::render_chart_with;

/// One documented Helm command: where it is and the value flags it passes.
#[derive(Debug)]
struct Documented {
    place: String,
    flags: Vec<String>,
}

/// The value flags of `words` (a `helm install|upgrade` command split as the shell
/// would), with their arguments.
fn value_flags(words: &[String]) -> Vec<String> {
    let mut flags = Vec::new();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--set" | "--set-string" | "--set-json" => {
                flags.push(w.clone());
                flags.push(it.next().cloned().unwrap_or_default());
            }
            _ if w.starts_with("--set=") || w.starts_with("--set-string=") => {
                let (flag, value) = w.split_once('=').expect("checked");
                flags.extend([flag.to_string(), value.to_string()]);
            }
            _ => {}
        }
    }
    flags
}

/// The `helm install|upgrade` commands in the shell blocks of `text`, continuation
/// lines joined and comments dropped.
fn commands(file: &str, text: &str) -> Vec<Documented> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            pending = None;
            continue;
        }
        if !in_block {
            continue;
        }
        let code = line.split(" #").next().unwrap_or("").trim_end();
        let (start, mut joined) = pending.take().unwrap_or((n + 1, String::new()));
        joined.push(' ');
        joined.push_str(code.trim_end_matches('\\'));
        if code.ends_with('\\') {
            pending = Some((start, joined));
            continue;
        }
        let words = shlex::split(&joined).unwrap_or_default();
        if words.first().map(String::as_str) == Some("helm")
            && matches!(
                words.get(1).map(String::as_str),
                Some("install" | "upgrade")
            )
        {
            out.push(Documented {
                place: format!("{file}:{start}"),
                flags: value_flags(&words),
            });
        }
    }
    out
}

fn documented() -> Vec<Documented> {
    let root = workspace();
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(root.join(Path::new(f)))
                .unwrap_or_else(|e| panic!("read {f}: {e}"));
            commands(f, &text)
        })
        .collect()
}

#[test]
fn every_documented_helm_command_renders_with_the_values_it_sets() {
    let all = documented();
    // The README's install and mirror commands and the quickstarts at least.
    assert!(
        all.iter().filter(|d| !d.flags.is_empty()).count() >= 5,
        "found too few documented helm commands with values: {all:?}"
    );
    for d in &all {
        let r = std::panic::catch_unwind(|| render_chart_with(&d.flags));
        if let Err(p) = r {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "Helm refused it".into());
            panic!(
                "{}: helm refuses the documented values {:?}: {why}",
                d.place, d.flags
            );
        }
    }
}

#[test]
fn a_misspelt_value_in_a_doc_would_fail() {
    let doc = "```sh\nhelm install hairpin x -n y \\\n  --set corends.mode=import   # typo\n```\n";
    let found = commands("doc.md", doc);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].flags, ["--set", "corends.mode=import"]);
    assert!(
        std::panic::catch_unwind(|| render_chart_with(&found[0].flags)).is_err(),
        "the schema refuses an unknown key"
    );
}
