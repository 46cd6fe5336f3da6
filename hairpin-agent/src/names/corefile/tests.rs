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
