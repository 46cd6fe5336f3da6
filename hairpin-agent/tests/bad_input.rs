//! Bad input at the edges where hairpin reads what others wrote: the node's hosts
//! file, the cluster's Corefile, hostnames from Ingress authors and annotations on
//! Services. Each must give a clear error naming the object and what was expected,
//! never a panic, and never a partial write.
//!
//! Cases already covered elsewhere are not repeated here: the pure marker errors
//! (names/hosts/tests.rs), hostile hostname strings (names/hostname.rs), invalid
//! names in Ingress/Gateway fields (names/routes/tests.rs), hairpin's own invalid
//! annotations from fixtures (tests/decide_fixtures.rs), the ConfigMap edge's errors
//! (tests/tests/coredns.rs), and arbitrary input (fuzz/ and the proptests).

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use hairpin_agent::{
    ProxyVersion,
    agent::parse_frontends_file_routes,
    k8s::{Defaults, Outcome, PROVIDER_ANNOTATIONS, Rule, SkipReason, ValueRule, decide},
    names::{
        Hostname, NameRoute, NameScope,
        corefile::{self, CorefileError, MARKER, MAX_COREFILE_BYTES, Rewrite},
        hosts::{BEGIN_MARKER, BlockError, END_MARKER, HostsError, MAX_HOSTS_FILE_BYTES},
        remove_hosts_block, write_hosts_block,
    },
};
use k8s_openapi::api::core::v1::Service;

// ---- /etc/hosts -----------------------------------------------------------------

fn route(host: &str) -> NameRoute {
    NameRoute {
        host: Hostname::parse(host).expect("valid name"),
        lb: "203.0.113.10".parse().expect("ip"),
        ports: vec![80, 443],
        version: ProxyVersion::V1,
        source: "test".into(),
    }
}

/// A hosts file in a fresh directory, with an old mtime so an unwanted write shows.
fn hosts_file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hosts");
    fs::write(&path, content).expect("write hosts");
    set_old_mtime(&path);
    (dir, path)
}

fn set_old_mtime(path: &Path) {
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    fs::File::options()
        .write(true)
        .open(path)
        .expect("open")
        .set_modified(past)
        .expect("set mtime");
}

/// (size, mtime, inode) and the bytes: what "left untouched" means.
fn snapshot(path: &Path) -> ((u64, SystemTime, u64), Vec<u8>) {
    let meta = fs::metadata(path).expect("stat");
    (
        (meta.len(), meta.modified().expect("mtime"), meta.ino()),
        fs::read(path).expect("read"),
    )
}

/// Both writers (`sync` and `cleanup`) refuse `content` with an error naming the
/// file and containing `expected`, and leave the file exactly as it was.
fn refused_untouched(content: &[u8], expected: &str) -> HostsError {
    let (_dir, path) = hosts_file(content);
    refused_untouched_at(&path, expected, true)
}

/// As [`refused_untouched`], for an existing file; `cleanup_too: false` when only
/// adding is refused (removing is always possible).
fn refused_untouched_at(path: &Path, expected: &str, cleanup_too: bool) -> HostsError {
    let before = snapshot(path);
    let relay = "192.0.2.1".parse().expect("ip");
    let err =
        write_hosts_block(path, &[route("app.example.com")], relay).expect_err("sync must refuse");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("hosts file {}: ", path.display())),
        "{msg}"
    );
    assert!(msg.contains(expected), "{msg}");
    assert!(msg.ends_with("(file left unchanged)"), "{msg}");
    assert!(snapshot(path) == before, "sync touched {}", path.display());
    if cleanup_too {
        let again = remove_hosts_block(path).expect_err("cleanup must refuse");
        assert_eq!(again.to_string(), msg);
        assert!(
            snapshot(path) == before,
            "cleanup touched {}",
            path.display()
        );
    }
    err
}

#[test]
fn half_written_hosts_blocks_are_refused_by_path_and_left_untouched() {
    let b = BEGIN_MARKER;
    let e = END_MARKER;
    let cases: Vec<(String, &str, BlockError)> = vec![
        (
            format!("127.0.0.1 localhost\n{b}\n192.0.2.1\tapp.example.com\n"),
            "line 2 but has no end: expected a \"# END hairpin managed block\" line after it",
            BlockError::Unterminated { line: 2 },
        ),
        (
            format!("{b}\n{b}\n192.0.2.1 a\n{e}\n"),
            "expected at most one managed block, found markers at lines 1 and 2",
            BlockError::MultipleBlocks {
                first: 1,
                second: 2,
            },
        ),
        (
            format!("{b}\n{e}\n10.0.0.1 x\n{b}\n{e}\n"),
            "found markers at lines 1 and 4",
            BlockError::MultipleBlocks {
                first: 1,
                second: 4,
            },
        ),
        (
            format!("{b}\n192.0.2.1 a\n{e}\n{e}\n"),
            "found markers at lines 3 and 4",
            BlockError::MultipleBlocks {
                first: 3,
                second: 4,
            },
        ),
        (
            format!("127.0.0.1 localhost\n{e}\n192.0.2.1 a\n{b}\n"),
            "at line 2: expected a \"# BEGIN hairpin managed block (do not edit)\" line before it",
            BlockError::StrayEnd { line: 2 },
        ),
        (
            format!("::1 localhost\r\n  {e}\r\n"),
            "at line 2: expected a",
            BlockError::StrayEnd { line: 2 },
        ),
    ];
    for (content, expected, kind) in cases {
        match refused_untouched(content.as_bytes(), expected) {
            HostsError::Content { source, .. } => assert_eq!(source, kind, "{content:?}"),
            other => panic!("{content:?}: {other}"),
        }
    }
}

#[test]
fn a_huge_hosts_file_is_refused_without_being_read() {
    let (_dir, path) = hosts_file(b"127.0.0.1 localhost\n");
    // 50 MiB, sparse: the refusal must come from its size, before any read.
    let len = 50 * 1024 * 1024;
    fs::File::options()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len)
        .expect("grow");
    set_old_mtime(&path);
    let err = refused_untouched_at(
        &path,
        &format!("expected at most {MAX_HOSTS_FILE_BYTES} bytes, got {len}"),
        true,
    );
    assert!(matches!(
        err,
        HostsError::Content {
            source: BlockError::TooLarge { len: 52_428_800 },
            ..
        }
    ));

    let over = vec![b'#'; MAX_HOSTS_FILE_BYTES + 1];
    refused_untouched(&over, "expected at most 1048576 bytes, got 1048577");

    // A file the block would push past the limit is not written (or hairpin would
    // then refuse its own file, cleanup included); removing stays possible.
    let mut at = vec![b'#'; MAX_HOSTS_FILE_BYTES - 1];
    at.push(b'\n');
    let (_dir, path) = hosts_file(&at);
    refused_untouched_at(&path, "with the managed block the file would be", false);
    assert!(!remove_hosts_block(&path).expect("nothing to remove"));

    let roomy = &at[1000..];
    let (_dir, path) = hosts_file(roomy);
    let relay = "192.0.2.1".parse().expect("ip");
    let report = write_hosts_block(&path, &[route("app.example.com")], relay)
        .expect("a file with room is editable");
    assert!(report.changed);
    assert!(remove_hosts_block(&path).expect("cleanup"));
    assert_eq!(fs::read(&path).expect("read"), roomy);
}

#[test]
fn binary_hosts_files_keep_every_byte() {
    let cases: [&[u8]; 4] = [
        b"127.0.0.1 localhost\n\0\0\0\n",
        b"\xff\xfe\xfd not utf-8 \x80\n10.0.0.1 x",
        b"\0",
        b"127.0.0.1 localhost\r\n\x1b[31mescape\r\n",
    ];
    for original in cases {
        let (_dir, path) = hosts_file(original);
        let relay = "192.0.2.1".parse().expect("ip");
        let report = write_hosts_block(&path, &[route("app.example.com")], relay)
            .unwrap_or_else(|e| panic!("{original:?}: {e}"));
        assert!(report.changed);
        let written = fs::read(&path).expect("read");
        assert!(written.starts_with(original), "{written:?}");
        assert!(remove_hosts_block(&path).expect("cleanup"));
        assert_eq!(fs::read(&path).expect("read"), original);
    }
}

// ---- Corefile -------------------------------------------------------------------

const TARGET: &str = "hairpin.hairpin-system.svc.cluster.local";
const KUBEADM: &str = ".:53 {\n    errors\n    forward . /etc/resolv.conf\n}\n";

fn rewrites() -> Vec<Rewrite> {
    let target = Hostname::parse(TARGET).expect("target");
    ["app.example.com", "*.apps.example.com"]
        .into_iter()
        .map(|h| Rewrite::new(Hostname::parse(h).expect("name"), target.clone()).expect("rw"))
        .collect()
}

#[test]
fn a_huge_corefile_is_refused_whole() {
    // 50 MiB: a ConfigMap cannot hold it (1 MiB), so it did not come from one.
    let mut huge = String::from(KUBEADM);
    let filler = "    # padding padding padding padding padding padding padding padding\n";
    while huge.len() < 50 * 1024 * 1024 {
        huge.push_str(filler);
    }
    let err = corefile::apply(&huge, &rewrites()).expect_err("too large");
    assert_eq!(err, CorefileError::TooLarge { len: huge.len() });
    assert_eq!(
        err.to_string(),
        format!(
            "corefile: expected at most {MAX_COREFILE_BYTES} bytes (the ConfigMap size limit), got {}",
            huge.len()
        )
    );
    // Removing (cleanup) still works, linearly, and changes nothing here.
    assert_eq!(corefile::remove(&huge), huge);
}

#[test]
fn binary_corefiles_round_trip() {
    // A ConfigMap's `data` is UTF-8, so invalid UTF-8 cannot reach the editor
    // (`binaryData` is a different field); NUL and control bytes can.
    for original in [
        ".:53 {\n    errors\0\n}\n\0\0".to_string(),
        "# \x1b[0m\n.:53 {\n\x1b[0m\n}\n".to_string(),
        ".:53 {\n\u{2028}\n}".to_string(),
    ] {
        let out =
            corefile::apply(&original, &rewrites()).unwrap_or_else(|e| panic!("{original:?}: {e}"));
        assert_eq!(out.matches(MARKER).count(), 2, "{out:?}");
        assert_eq!(corefile::remove(&out), original);
    }
}

#[test]
fn half_written_and_duplicated_hairpin_lines_are_replaced_in_one_place() {
    let stray = format!("    rewrite name exact old.example.com {TARGET} {MARKER}\n");
    // Our lines duplicated, left in another block, and after the last brace, as a
    // crashed writer or a hand edit might leave them.
    let messy =
        format!("example.org:53 {{\n{stray}}}\n.:53 {{\n{stray}{stray}    errors\n}}\n{stray}");
    let clean = "example.org:53 {\n}\n.:53 {\n    errors\n}\n";
    assert_eq!(corefile::remove(&messy), clean);
    let out = corefile::apply(&messy, &rewrites()).expect("editable");
    assert_eq!(out.matches(MARKER).count(), 2, "{out}");
    assert!(!out.contains("old.example.com"), "{out}");
    assert!(
        out.starts_with(&format!("example.org:53 {{\n}}\n.:53 {{\n    rewrite name exact app.example.com {TARGET} {MARKER}\n")),
        "{out}"
    );
    assert_eq!(corefile::remove(&out), clean);

    // Truncated mid-edit: the opener is the last line, without its newline.
    assert_eq!(
        corefile::apply("# head\n.:53 {", &rewrites()),
        Err(CorefileError::UnterminatedServerBlock { line: 2 })
    );
    // Truncated after the opener (no closing brace): CoreDNS refuses such a file
    // ("expected '}'"), so nothing is added to it; removing ours still works. (Before
    // issue 14 this case was edited, producing another file CoreDNS would refuse.)
    let truncated = ".:53 {\n    errors\n";
    assert_eq!(
        corefile::apply(truncated, &rewrites()),
        Err(CorefileError::UnclosedBlock { line: 1 })
    );
    let with_ours = format!(".:53 {{\n{stray}    errors\n");
    assert_eq!(
        corefile::apply(&with_ours, &[]).expect("removable"),
        truncated
    );
}

/// Issue 14 finding 3: whatever the Corefile, `apply` never returns a text CoreDNS
/// could not parse. Unbalanced input is refused with the line; balanced input with a
/// nested `forward . X {` before the main block is edited in the main block.
#[test]
fn an_unparseable_corefile_is_never_produced() {
    let refused: [(&str, CorefileError); 5] = [
        (
            ".:53 {\n    errors\n",
            CorefileError::UnclosedBlock { line: 1 },
        ),
        (
            ".:53 {\n    forward . 1.1.1.1 {\n}\n",
            CorefileError::UnclosedBlock { line: 1 },
        ),
        (".:53 {\n}\n}\n", CorefileError::UnexpectedClose { line: 3 }),
        (
            "}\n.:53 {\n    errors\n}\n",
            CorefileError::UnexpectedClose { line: 1 },
        ),
        (
            ".:53 {\n    hosts \"x\n}\n",
            CorefileError::UnterminatedQuote { line: 2 },
        ),
    ];
    for (corefile, want) in refused {
        let err = corefile::apply(corefile, &rewrites()).expect_err(corefile);
        assert_eq!(err, want, "{corefile:?}");
        assert!(err.to_string().starts_with("corefile: "), "{err}");
    }
    // Every prefix of a real Corefile with a nested block: either refused or edited
    // with our lines at depth 1 of the main block (checked by `apply` itself, and
    // again here by counting braces before each of our lines).
    let full = "stub.local:53 {\n    forward . 10.150.0.1 {\n        force_tcp\n    }\n}\n.:53 {\n    errors\n    cache 30\n}\n";
    for cut in 0..=full.len() {
        let Ok(out) = corefile::apply(&full[..cut], &rewrites()) else {
            continue;
        };
        // Only the whole file, or the whole file without its last newline.
        assert!(
            cut + 1 >= full.len(),
            "edited a truncated Corefile: {:?}",
            &full[..cut]
        );
        let mut depth = 0i32;
        for line in out.lines() {
            if line.ends_with(MARKER) {
                assert_eq!(depth, 1, "{out}");
            }
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        }
        assert_eq!(depth, 0);
        assert!(
            out.contains(&format!(
                ".:53 {{\n    rewrite name exact app.example.com {TARGET} {MARKER}\n"
            )),
            "{out}"
        );
    }
}

// ---- hostnames ------------------------------------------------------------------

/// Hostnames built to inject a line into /etc/hosts or a block into a Corefile.
const INJECTIONS: &[&str] = &[
    "a.example.com\n203.0.113.66 bank.example.com",
    "a.example.com\r\n# END hairpin managed block",
    "a.example.com\rb",
    "a.example.com # comment",
    "a.example.com#",
    "a.example.com }\nevil.:53 {\n  forward . 198.51.100.1\n}",
    "{a.example.com}",
    "a example.com",
    "a.example.com\t",
    "a.example.com\0",
    "ünicode.example.com",
    "a.example.com\u{2028}",
    "xn--n.example.com\u{200b}",
];

fn frontends_file(hosts: &str) -> String {
    format!(
        "frontends:\n- ip: 203.0.113.10\n  ports: [443]\n  proxyProtocol: v1\n  hosts: [ok.example.com, {hosts}]\n"
    )
}

#[test]
fn injected_and_oversized_hostnames_are_rejected_naming_the_field() {
    let long_label = format!("{}.example.com", "a".repeat(64));
    let name_300 = ["a".repeat(60).as_str(); 5].join(".");
    assert_eq!(name_300.len(), 304);
    let mut cases: Vec<String> = INJECTIONS.iter().map(|s| s.to_string()).collect();
    cases.extend([long_label, name_300]);
    let path = Path::new("/etc/hairpin/frontends.yaml");
    for value in &cases {
        let err = Hostname::parse(value).expect_err(value);
        let text = err.to_string();
        assert!(text.starts_with(&format!("hostname {value:?}: ")), "{text}");
        assert!(!text.contains(['\n', '\r', '\0']), "{text:?}");

        // Through the frontends file: the file, the entry and the field are named.
        let yaml = frontends_file(&serde_json_string(value));
        let scope = NameScope::none();
        let err = parse_frontends_file_routes(path, &yaml, &scope).expect_err(value);
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "frontends file /etc/hairpin/frontends.yaml: frontends[0].hosts[1]: hostname "
            ),
            "{msg}"
        );
        assert!(!msg.contains(['\n', '\r', '\0']), "{msg:?}");
    }
    let err = Hostname::parse(&["a".repeat(60).as_str(); 5].join(".")).expect_err("300");
    assert!(
        err.to_string()
            .contains("expected at most 253 characters, got 304"),
        "{err}"
    );
}

/// A YAML double-quoted scalar for `s` (JSON strings are valid YAML).
fn serde_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || !c.is_ascii() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---- Service annotations --------------------------------------------------------

fn digitalocean_without_annotations() -> Service {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/services/digitalocean.yaml");
    let text = fs::read_to_string(&path).expect("fixture");
    let mut svc: Service = yaml_serde::from_str(&text).expect("a Service");
    svc.metadata.annotations = Some(Default::default());
    svc
}

fn with(pairs: &[(&str, &str)]) -> Service {
    let mut svc = digitalocean_without_annotations();
    let notes = svc.metadata.annotations.get_or_insert_default();
    for (k, v) in pairs {
        notes.insert(k.to_string(), v.to_string());
    }
    svc
}

const SERVICE: &str = "ingress-nginx/ingress-nginx-controller";

#[test]
fn malformed_hairpin_annotations_name_the_service_the_annotation_and_the_expectation() {
    // Surrounding blanks are trimmed (a YAML block scalar ends in a newline), so
    // "v1\n" reads as v1; everything else below is refused.
    for value in [
        "",
        " ",
        "v1;v2",
        "true",
        "V 1",
        "ｖ1",
        "v1\0",
        &"v".repeat(10_000),
    ] {
        let d = decide(
            &with(&[("hairpin.dev/proxy-protocol", value)]),
            &Defaults::default(),
        );
        let Outcome::Invalid(err) = &d.outcome else {
            panic!("{value:?}: {d:#?}")
        };
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "service {SERVICE}: annotation hairpin.dev/proxy-protocol is "
            )) && msg.ends_with("; expected v1, v2 or off"),
            "{msg}"
        );
        assert!(d.frontends.is_empty());
        // Regression (decide fuzz target): a long value used to push "expected ..."
        // out of the 1 KiB Event message; values are now quoted as excerpts.
        assert!(
            d.summary().ends_with("; expected v1, v2 or off"),
            "{}",
            d.summary()
        );
    }
    for (value, expected) in [
        (
            "",
            "expected comma-separated port numbers or names, with no empty entries",
        ),
        (",", "with no empty entries"),
        ("80,,443", "with no empty entries"),
        ("80, ", "with no empty entries"),
        (
            "99999",
            "lists \"99999\", which is not a port number or name in spec.ports (the Service has 80/http, 443/https)",
        ),
        ("-80", "lists \"-80\", which is not a port number"),
        ("80/TCP", "lists \"80/TCP\""),
        ("http\nhttps", "lists \"http\\nhttps\""),
        ("ｈttp", "which is not a port number or name"),
    ] {
        let d = decide(
            &with(&[
                ("hairpin.dev/proxy-protocol", "v2"),
                ("hairpin.dev/ports", value),
            ]),
            &Defaults::default(),
        );
        let Outcome::Invalid(err) = &d.outcome else {
            panic!("{value:?}: {d:#?}")
        };
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("service {SERVICE}: annotation hairpin.dev/ports ")),
            "{msg}"
        );
        assert!(msg.contains(expected), "{value:?}: {msg}");
    }
}

#[test]
fn malformed_provider_annotations_never_panic_and_warn_naming_the_annotation() {
    let junk = [
        "",
        " ",
        "yes",
        "maybe\n{",
        "80,abc",
        "{\"proxy-protocol\":",
        "v9",
        "🙃",
        "\0",
    ];
    for row in PROVIDER_ANNOTATIONS {
        let key = match row.rule {
            ValueRule::LinodePortJson => format!("{}443", row.key),
            _ => row.key.to_string(),
        };
        for value in junk {
            let d = decide(&with(&[(&key, value)]), &Defaults::default());
            let context = format!("{key}={value:?}: {d:#?}");
            // Junk never turns the PROXY protocol on...
            assert!(d.frontends.is_empty(), "{context}");
            assert_eq!(
                d.outcome,
                Outcome::Skipped(SkipReason::ProxyProtocolOff),
                "{context}"
            );
            // ...the decision says which provider annotation decided...
            let Some(Rule::Provider { annotations, .. }) = &d.rule else {
                panic!("{context}")
            };
            assert_eq!(annotations, std::slice::from_ref(&key), "{context}");
            assert!(d.summary().contains(&key), "{context}");
            // ...and a value the provider's controller rejects is a warning that names
            // the Service, the annotation and what the controller expects.
            for w in &d.warnings {
                assert!(w.starts_with(&format!("service {SERVICE}")), "{w}");
            }
            if let Some(w) = d.warnings.iter().find(|w| w.contains("does not accept")) {
                assert!(w.contains(&format!("annotation {key} is {value:?}")), "{w}");
                assert!(w.contains("expected"), "{w}");
            }
        }
    }
    // Values each rule rejects (rather than reads as "off") do warn.
    for (key, value, expected) in [
        (
            "load-balancer.hetzner.cloud/uses-proxyprotocol",
            "yes",
            "expected a boolean such as true or false",
        ),
        (
            "service.beta.kubernetes.io/scw-loadbalancer-proxy-protocol-v2",
            "80,abc",
            "expected true, false, * or Service port numbers, got \"abc\"",
        ),
        (
            "service.beta.kubernetes.io/linode-loadbalancer-port-443",
            "{\"proxy-protocol\":",
            "expected a JSON object",
        ),
        (
            "service.beta.kubernetes.io/linode-loadbalancer-default-proxy-protocol",
            "v9",
            "expected none, v1 or v2",
        ),
    ] {
        let d = decide(&with(&[(key, value)]), &Defaults::default());
        assert!(
            d.warnings.iter().any(|w| w
                .starts_with(&format!("service {SERVICE}: annotation {key} is {value:?}"))
                && w.contains(expected)),
            "{key}={value:?}: {:#?}",
            d.warnings
        );
        assert!(d.summary().contains(expected), "{}", d.summary());
    }
}

/// Regressions found by the `decide` fuzz target: a Service whose only TCP ports
/// were outside 1..=65535 was "Proxied" with no frontend (port 0 even became a
/// frontend), and ingress entries with neither ip nor hostname gave a skip with
/// no message ("no reason recorded").
#[test]
fn out_of_range_ports_and_empty_ingress_entries_are_skipped_with_a_reason() {
    for bad in [0, -1, 65536, i32::MAX] {
        let mut svc = with(&[("hairpin.dev/proxy-protocol", "v1")]);
        let ports = svc
            .spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .expect("ports");
        ports.truncate(1);
        ports[0].port = bad;
        let d = decide(&svc, &Defaults::default());
        assert!(d.frontends.is_empty(), "{bad}: {d:#?}");
        assert_eq!(
            d.outcome,
            Outcome::Skipped(SkipReason::ProxyProtocolOff),
            "{d:#?}"
        );
        assert!(
            d.skips.iter().any(|s| s.reason == SkipReason::InvalidPort
                && s.message
                    == format!(
                        "port {bad}/http is outside 1-65535; not a TCP port hairpin can proxy"
                    )),
            "{d:#?}"
        );
    }

    let mut svc = with(&[("hairpin.dev/proxy-protocol", "v1")]);
    let ingress = svc
        .status
        .as_mut()
        .and_then(|s| s.load_balancer.as_mut())
        .and_then(|lb| lb.ingress.as_mut())
        .expect("ingress");
    ingress[0].ip = None;
    let d = decide(&svc, &Defaults::default());
    assert_eq!(
        d.outcome,
        Outcome::Skipped(SkipReason::NoLoadBalancerStatus)
    );
    assert_eq!(
        d.summary(),
        format!(
            "hairpin does not proxy this Service: service {SERVICE} has status.loadBalancer.ingress entries without an ip or hostname: the load balancer is not provisioned"
        )
    );
}
