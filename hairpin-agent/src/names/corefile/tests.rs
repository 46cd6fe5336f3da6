//! Unit tests for the Corefile and import-file rendering.

use super::*;

const TARGET: &str = "hairpin.hairpin-system.svc.cluster.local";

fn rw(host: &str) -> Rewrite {
    Rewrite::new(
        Hostname::parse(host).unwrap(),
        Hostname::parse(TARGET).unwrap(),
    )
    .unwrap()
}

const KUBEADM: &str = ".:53 {
    errors
    health {
       lameduck 5s
    }
    forward . /etc/resolv.conf
}
";

#[test]
fn directives_for_exact_and_wildcard_names() {
    assert_eq!(
        rw("App.Example.com").directive(),
        "rewrite name exact app.example.com hairpin.hairpin-system.svc.cluster.local"
    );
    assert_eq!(
        rw("*.apps.example.com").directive(),
        r"rewrite name regex ^[^.]+\.apps\.example\.com\.$ hairpin.hairpin-system.svc.cluster.local answer auto"
    );
}

#[test]
fn wildcard_target_is_rejected() {
    let err = Rewrite::new(
        Hostname::parse("a.io").unwrap(),
        Hostname::parse("*.svc.io").unwrap(),
    );
    assert_eq!(
        err.unwrap_err().to_string(),
        "rewrite target \"*.svc.io\": expected an exact service name, got a wildcard"
    );
}

#[test]
fn inserts_after_the_opener_with_the_block_indentation_then_removes() {
    let out = apply(
        KUBEADM,
        &[
            rw("*.example.com"),
            rw("b.example.com"),
            rw("a.example.com"),
            rw("a.example.com"),
        ],
    )
    .unwrap();
    let want = format!(
        ".:53 {{
    rewrite name exact a.example.com {TARGET} {MARKER}
    rewrite name exact b.example.com {TARGET} {MARKER}
    rewrite name regex ^[^.]+\\.example\\.com\\.$ {TARGET} answer auto {MARKER}
    errors
"
    );
    assert!(out.starts_with(&want), "{out}");
    assert_eq!(remove(&out), KUBEADM);
    assert_eq!(
        apply(&out, &[rw("a.example.com")])
            .unwrap()
            .matches(MARKER)
            .count(),
        1
    );
    assert_eq!(apply(&out, &[]).unwrap(), KUBEADM);
}

#[test]
fn recognises_opener_spellings_and_tabs() {
    for opener in [
        ".:53 {",
        ".:53{",
        ". {",
        ".:53    {   ",
        "  .:53 {",
        "dns://.:53 {",
        ".:53 , example.org:53 {",
        ".:53 { # main",
    ] {
        let corefile = format!("# comment\n{opener}\n\terrors\n}}\n");
        let out = apply(&corefile, &[rw("a.io")]).unwrap_or_else(|e| panic!("{opener:?}: {e}"));
        assert!(
            out.contains(&format!(
                "{opener}\n\trewrite name exact a.io {TARGET} {MARKER}\n\terrors\n"
            )),
            "{out}"
        );
        assert_eq!(remove(&out), corefile);
    }
}

#[test]
fn empty_block_gets_default_indentation_and_crlf_is_kept() {
    let out = apply("  .:53 {\r\n  }\r\n", &[rw("a.io")]).unwrap();
    assert_eq!(
        out,
        format!("  .:53 {{\r\n      rewrite name exact a.io {TARGET} {MARKER}\r\n  }}\r\n")
    );
}

#[test]
fn first_root_block_wins_over_other_zones() {
    let corefile = "example.org:53 {\n    forward . 1.1.1.1\n}\n.:5353 {\n}\n.:53 {\n  errors\n}\n";
    let out = apply(corefile, &[rw("a.io")]).unwrap();
    assert!(
        out.contains(&format!(
            ".:53 {{\n  rewrite name exact a.io {TARGET} {MARKER}\n  errors\n"
        )),
        "{out}"
    );
}

#[test]
fn keeps_hairpin_proxy_lines() {
    let corefile = ".:53 {\n    rewrite name a.io hairpin-proxy.hairpin-proxy.svc.cluster.local # Added by hairpin-proxy\n}\n";
    assert_eq!(remove(corefile), corefile);
    let out = apply(corefile, &[rw("b.io")]).unwrap();
    assert!(out.contains("# Added by hairpin-proxy\n"));
    assert_eq!(remove(&out), corefile);
}

#[test]
fn missing_or_unterminated_server_block_is_an_error() {
    for corefile in [
        "",
        "example.org {\n}\n",
        ".:5353 {\n}\n",
        "# .:53 {\n",
        ". { errors }\n",
    ] {
        let err = apply(corefile, &[rw("a.io")]).unwrap_err();
        assert_eq!(err, CorefileError::NoMainServerBlock, "{corefile:?}");
        assert_eq!(
            err.to_string(),
            "corefile: expected a main server block opening line such as \".:53 {\" or \". {\", found none"
        );
    }
    assert_eq!(
        apply("x\n.:53 {", &[rw("a.io")]).unwrap_err(),
        CorefileError::UnterminatedServerBlock { line: 2 }
    );
    // Nothing to add: no block needed.
    assert_eq!(apply("", &[]).unwrap(), "");
}

#[test]
fn import_file_lists_the_directives() {
    let out = render_import(&[rw("*.example.com"), rw("a.example.com")]);
    assert_eq!(
        out,
        format!(
            "# Managed by hairpin: in-cluster names of PROXY-protocol LoadBalancers go to the relay.\n\
             rewrite name exact a.example.com {TARGET}\n\
             rewrite name regex ^[^.]+\\.example\\.com\\.$ {TARGET} answer auto\n"
        )
    );
    assert!(IMPORT_KEY.ends_with(".override"));
    assert_eq!(render_import(&[]).lines().count(), 1);
}

/// Finding 3 of issue 14: a stub-domain server block whose `forward` has its own
/// block came before `.:53 {`; its line `forward . 10.150.0.1 {` has `.` among its
/// words and ends in `{`, and the rewrites landed inside it. CoreDNS then refused
/// the reload (`rewrite` is not a `forward` option) and a restart crash-looped.
#[test]
fn a_nested_forward_block_is_not_the_main_server_block() {
    let corefile = "consul.local:53 {
    errors
    forward . 10.150.0.1 {
        force_tcp
    }
}
.:53 {
    errors
    forward . /etc/resolv.conf
}
";
    let out = apply(corefile, &[rw("a.io")]).unwrap();
    assert_eq!(
        out,
        format!(
            "consul.local:53 {{
    errors
    forward . 10.150.0.1 {{
        force_tcp
    }}
}}
.:53 {{
    rewrite name exact a.io {TARGET} {MARKER}
    errors
    forward . /etc/resolv.conf
}}
"
        )
    );
    assert_eq!(remove(&out), corefile);
    // An opener line holding another brace first (found by the corefile fuzz
    // target): the line after it is at depth 2, so it is not the main block.
    let two_braces = ". { errors } x . {\n    health\n}\n";
    assert_eq!(
        apply(two_braces, &[rw("a.io")]),
        Err(CorefileError::NoMainServerBlock)
    );
    let then_main = format!("{two_braces}.:53 {{\n}}\n");
    assert!(
        apply(&then_main, &[rw("a.io")])
            .unwrap()
            .ends_with(&format!(
                ".:53 {{\n    rewrite name exact a.io {TARGET} {MARKER}\n}}\n"
            ))
    );
    // Only the nested block and no main block: refused, never put inside it.
    let only_stub = "consul.local:53 {\n    forward . 10.150.0.1 {\n        force_tcp\n    }\n}\n";
    assert_eq!(
        apply(only_stub, &[rw("a.io")]),
        Err(CorefileError::NoMainServerBlock)
    );
}

#[test]
fn comments_and_quoted_strings_are_read_as_coredns_reads_them() {
    // A `#` anywhere outside quotes starts a comment, even inside a word; braces in
    // comments and inside longer quoted strings open nothing (a quoted `"{"` alone
    // would: the parser compares token text).
    let corefile = "# .:53 {
example.org {
    template IN A example.org {
        answer \"{{ .Name }} 60 IN A 10.0.0.1\" # }
    }
    hosts {
        10.0.0.1 \"} {\"
    }
}
.:53 {# main, with a comment glued to the brace
    errors
}
";
    let out = apply(corefile, &[rw("a.io")]).unwrap();
    assert!(
        out.contains(&format!(
            ".:53 {{# main, with a comment glued to the brace\n    rewrite name exact a.io {TARGET} {MARKER}\n    errors\n"
        )),
        "{out}"
    );
    assert_eq!(out.matches(MARKER).count(), 1);
    assert_eq!(remove(&out), corefile);

    // A quoted string spanning lines hides an opener-looking line.
    let quoted = "example.org {\n    hosts \"\n.:53 {\n\" \n}\n. {\n}\n";
    let out = apply(quoted, &[rw("a.io")]).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.ends_with(&format!(
            ". {{\n    rewrite name exact a.io {TARGET} {MARKER}\n}}\n"
        )),
        "{out}"
    );
}

#[test]
fn the_lexer_follows_corednss_rules() {
    let lexed = lex("\u{feff}a#b c\n\"q \\\"x\\\" \\n\" {\r\n}\"\" d\r\n\"{\"");
    let words: Vec<(&str, usize, bool)> = lexed
        .tokens
        .iter()
        .map(|t| (t.text.as_str(), t.line, t.quoted))
        .collect();
    assert_eq!(
        words,
        [
            ("a", 0, false),
            ("q \"x\" \\n", 1, true),
            ("{", 1, false),
            ("}\"\"", 2, false),
            ("d", 2, false),
            ("{", 3, true),
        ]
    );
    assert_eq!(lexed.open_quote, None);
    assert_eq!(lex("a \"b\nc").open_quote, Some(0));
}

#[test]
fn corefiles_coredns_would_refuse_are_refused_naming_the_line() {
    // What each refusal says, written out once per kind.
    let message = |e: &CorefileError| match *e {
        CorefileError::UnexpectedClose { line } => format!(
            "corefile: line {line}: '}}' closes no block (expected every '}}' to match an earlier '{{')"
        ),
        CorefileError::UnclosedBlock { line } => format!(
            "corefile: block opened at line {line} is never closed (expected a matching '}}')"
        ),
        CorefileError::UnterminatedQuote { line } => format!(
            "corefile: quoted string opened at line {line} never ends (expected a closing '\"')"
        ),
        ref other => panic!("not a structure refusal: {other:?}"),
    };
    let cases = [
        // A quoted "}" is a brace to CoreDNS's parser (it compares token text).
        (
            ".:53 {\n    hosts \"}\"\n}\n",
            CorefileError::UnexpectedClose { line: 3 },
        ),
        (
            ".:53 {\n    errors\n}\n}\n",
            CorefileError::UnexpectedClose { line: 4 },
        ),
        (
            ".:53 {\n    errors\n    health {\n}\n",
            CorefileError::UnclosedBlock { line: 1 },
        ),
        (
            "example.org {\n    forward . 1.1.1.1 {\n}\n.:53 {\n}\n",
            CorefileError::UnclosedBlock { line: 1 },
        ),
        (
            ".:53 {\n    hosts \"oops\n}\n",
            CorefileError::UnterminatedQuote { line: 2 },
        ),
    ];
    for (corefile, want) in cases {
        let err = apply(corefile, &[rw("a.io")]).unwrap_err();
        assert_eq!(err, want, "{corefile:?}");
        assert_eq!(err.to_string(), message(&want));
        // Removing our lines never needs the structure (cleanup always works).
        assert_eq!(apply(corefile, &[]).unwrap(), corefile);
    }
}

/// Lines an older hairpin put inside a nested block are taken out and the
/// rewrites go where they belong.
#[test]
fn lines_misplaced_by_an_older_version_are_moved_to_the_main_block() {
    let misplaced = format!(
        "stub.local {{\n    forward . 10.150.0.1 {{\n    rewrite name exact a.io {TARGET} {MARKER}\n        force_tcp\n    }}\n}}\n.:53 {{\n    errors\n}}\n"
    );
    let out = apply(&misplaced, &[rw("a.io")]).unwrap();
    assert_eq!(
        out,
        format!(
            "stub.local {{\n    forward . 10.150.0.1 {{\n        force_tcp\n    }}\n}}\n.:53 {{\n    rewrite name exact a.io {TARGET} {MARKER}\n    errors\n}}\n"
        )
    );
}

#[test]
fn validation_refuses_an_edit_that_is_not_ours_at_depth_one() {
    let base = "stub {\n    forward . 1.1.1.1 {\n    }\n}\n.:53 {\n}\n";
    let line = format!("    rewrite name exact a.io {TARGET} {MARKER}\n");
    // Inside the nested block: what the old editor produced.
    let nested = base.replacen("1.1.1.1 {\n", &format!("1.1.1.1 {{\n{line}"), 1);
    let err = validate(base, &nested, 1).unwrap_err();
    assert!(
        matches!(&err, CorefileError::InvalidEdit { reason } if reason.contains("line 3")),
        "{err}"
    );
    assert!(err.to_string().ends_with("; nothing written"), "{err}");
    // Right after the main opener: accepted.
    let good = base.replacen(".:53 {\n", &format!(".:53 {{\n{line}"), 1);
    assert_eq!(validate(base, &good, 1), Ok(()));
    // Something else changed too.
    let changed = good.replace("1.1.1.1", "9.9.9.9");
    assert!(validate(base, &changed, 1).is_err());
    // A brace or a second directive smuggled onto our line.
    let smuggled = good.replace("cluster.local #", "cluster.local } #");
    assert!(validate(base, &smuggled, 1).is_err());
}
