//! The Helm chart, rendered without Helm: Helm is not installable where these tests
//! run, so `render_chart_template` implements the few template constructs the chart
//! uses and panics on any other; each variant's values must render what kustomize
//! renders for it.

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::Value as Json;
use yaml_serde::Value as Yaml;

use super::{
    VARIANTS,
    render::{docs, kustomize, normalize, parse_all, read, root},
};

/// Renders one chart template with `values`. Implements only what the chart uses:
/// `{{ expr }}` with `{{-`/`-}}` trimming; `if`/`else`/`end`; expressions `.Values.a.b`,
/// `.Release.Namespace`, `eq X "lit"`, `ne X "lit"`, `not X`, and pipes into `quote`,
/// `toYaml` and `nindent N`. Anything else panics, so the chart cannot silently
/// outgrow this test.
fn render_chart_template(src: &str, values: &Yaml, namespace: &str) -> String {
    // Tokens: text and actions, with trimming applied to neighbouring text.
    let mut tokens: Vec<(bool, String)> = Vec::new(); // (is_action, text)
    let mut rest = src;
    while let Some(start) = rest.find("{{") {
        let (text, after) = rest.split_at(start);
        let end = after.find("}}").expect("unterminated {{");
        let mut action = &after[2..end];
        let mut text = text.to_string();
        if let Some(a) = action.strip_prefix('-') {
            text = text.trim_end().to_string();
            action = a;
        }
        let trim_after = action.ends_with('-');
        if trim_after {
            action = &action[..action.len() - 1];
        }
        tokens.push((false, text));
        tokens.push((true, action.trim().to_string()));
        rest = &after[end + 2..];
        if trim_after {
            rest = rest.trim_start();
        }
    }
    tokens.push((false, rest.to_string()));

    let lookup = |path: &str| -> Yaml {
        if path == ".Release.Namespace" {
            return Yaml::String(namespace.into());
        }
        let p = path
            .strip_prefix(".Values.")
            .unwrap_or_else(|| panic!("chart: unsupported reference {path}"));
        p.split('.').fold(values.clone(), |v, k| {
            v.get(k).cloned().unwrap_or(Yaml::Null)
        })
    };
    let truthy = |v: &Yaml| match v {
        Yaml::Null => false,
        Yaml::Bool(b) => *b,
        Yaml::String(s) => !s.is_empty(),
        Yaml::Number(n) => n.as_f64() != Some(0.0),
        Yaml::Sequence(s) => !s.is_empty(),
        Yaml::Mapping(m) => !m.is_empty(),
        Yaml::Tagged(_) => true,
    };
    let scalar = |v: &Yaml| match v {
        Yaml::String(s) => s.clone(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Null => String::new(),
        other => panic!("chart: printing a non-scalar {other:?} needs toYaml"),
    };
    let eval = |expr: &str| -> Yaml {
        let mut parts = expr.split('|').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let words: Vec<&str> = head.split_whitespace().collect();
        let mut v = match words.as_slice() {
            [p] => lookup(p),
            ["not", p] => Yaml::Bool(!truthy(&lookup(p))),
            ["eq", p, lit] => Yaml::Bool(scalar(&lookup(p)) == lit.trim_matches('"')),
            ["ne", p, lit] => Yaml::Bool(scalar(&lookup(p)) != lit.trim_matches('"')),
            ["toYaml", p] => {
                let text = yaml_serde::to_string(&lookup(p)).expect("toYaml");
                Yaml::String(text.trim_end().to_string())
            }
            other => panic!("chart: unsupported expression {other:?}"),
        };
        for f in parts {
            let fw: Vec<&str> = f.split_whitespace().collect();
            v = match fw.as_slice() {
                ["quote"] => Yaml::String(format!("{:?}", scalar(&v))),
                ["nindent", n] => {
                    let pad = " ".repeat(n.parse().expect("nindent width"));
                    let body: Vec<String> =
                        scalar(&v).lines().map(|l| format!("{pad}{l}")).collect();
                    Yaml::String(format!("\n{}", body.join("\n")))
                }
                other => panic!("chart: unsupported function {other:?}"),
            };
        }
        v
    };

    // Evaluate with a stack of (emitting, branch_taken) for if/else/end.
    let mut out = String::new();
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let emitting = |stack: &Vec<(bool, bool)>| stack.iter().all(|(e, _)| *e);
    for (is_action, text) in tokens {
        if !is_action {
            if emitting(&stack) {
                out.push_str(&text);
            }
            continue;
        }
        if let Some(cond) = text.strip_prefix("if ") {
            let c = emitting(&stack) && truthy(&eval(cond));
            stack.push((c, c));
        } else if text == "else" {
            let (_, taken) = stack.pop().expect("else without if");
            stack.push((!taken, true));
        } else if text == "end" {
            stack.pop().expect("end without if");
        } else if emitting(&stack) {
            out.push_str(&scalar(&eval(&text)));
        }
    }
    assert!(stack.is_empty(), "chart: unclosed if");
    out
}

/// Renders every YAML template of the chart with values.yaml overridden by `set`
/// (dotted keys), in namespace hairpin-system.
pub(super) fn render_chart(set: &[(&str, Yaml)]) -> Vec<Json> {
    let mut values: Yaml =
        yaml_serde::from_str(&read("deploy/chart/hairpin/values.yaml")).expect("values.yaml");
    for (key, v) in set {
        let mut cur = &mut values;
        for k in key.split('.') {
            cur = cur
                .get_mut(k)
                .unwrap_or_else(|| panic!("no value {key} in values.yaml"));
        }
        *cur = v.clone();
    }
    let dir = root().join("deploy/chart/hairpin/templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("templates dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let text = render_chart_template(
                &std::fs::read_to_string(f).expect("template"),
                &values,
                "hairpin-system",
            );
            docs(&text)
        })
        .collect()
}

/// Objects keyed by kind/namespace/name, without kustomize's part-of label and the
/// Namespace (Helm's --create-namespace makes it). Container env is sorted by name:
/// kustomize's strategic merge moves patched entries to the front, and the order of
/// plain `value`s carries no meaning (no entry refers to another with `$(NAME)`,
/// which `no_env_refers_to_another` checks).
pub(super) fn comparable(objs: Vec<Json>) -> BTreeMap<String, Json> {
    objs.into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|mut o| {
            if let Some(l) = o["metadata"]["labels"].as_object_mut() {
                l.remove("app.kubernetes.io/part-of");
            }
            if let Some(cs) = o["spec"]["template"]["spec"]["containers"].as_array_mut() {
                for c in cs {
                    if let Some(env) = c["env"].as_array_mut() {
                        env.sort_by_key(|e| e["name"].as_str().unwrap_or_default().to_string());
                    }
                }
            }
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, normalize(o))
        })
        .collect()
}

#[test]
fn chart_renders_what_kustomize_renders() {
    for v in VARIANTS {
        let set: Vec<(&str, Yaml)> = v
            .chart
            .iter()
            .map(|(k, val)| (*k, yaml_serde::from_str(val).expect("a YAML value")))
            .collect();
        let chart = render_chart(&set);
        parse_all(&chart, "chart");
        let Some(kustomized) = kustomize(v.dir) else {
            return;
        };
        let (a, b) = (comparable(chart), comparable(kustomized));
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "chart with {set:?} and {} render different objects",
            v.dir
        );
        for (key, obj) in &a {
            assert_eq!(
                serde_json::to_string_pretty(obj).expect("json"),
                serde_json::to_string_pretty(&b[key]).expect("json"),
                "{key}: the chart with {set:?} differs from {}",
                v.dir
            );
        }
    }
}

#[test]
fn no_env_refers_to_another() {
    for v in VARIANTS {
        let Some(objs) = kustomize(v.dir) else { return };
        for e in super::render::agent(&objs).env.iter().flatten() {
            assert!(
                !e.value.as_deref().unwrap_or_default().contains("$("),
                "{}: {} refers to another variable: env order matters then",
                v.dir,
                e.name
            );
        }
    }
}

#[test]
fn chart_renderer_refuses_what_it_does_not_implement() {
    let values: Yaml = yaml_serde::from_str("a: 1").expect("yaml");
    for src in [
        "{{ include \"x\" . }}",
        "{{ range .Values.a }}{{ end }}",
        "{{ .Values.a | upper }}",
        "{{ if (eq .Values.a \"1\") }}{{ end }}",
    ] {
        let r = std::panic::catch_unwind(|| render_chart_template(src, &values, "ns"));
        assert!(r.is_err(), "the renderer must refuse {src}");
    }
    assert_eq!(
        render_chart_template("x: {{ .Values.a }}", &values, "ns"),
        "x: 1"
    );
}
