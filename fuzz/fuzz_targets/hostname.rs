//! The hostname validator (`fallback::hostname`), the gate between what an Ingress
//! author writes and the node's /etc/hosts and the cluster's Corefile; and, on the
//! same strings, `k8s::coredns::ObjectName` (`--coredns-configmap NAMESPACE/NAME`).
//!
//! Invariants:
//! - an accepted name holds only `[a-z0-9.-]` after an optional leading `*.`: no
//!   whitespace, newline, `#`, `{`, `}`, quote, NUL or non-ASCII; at most 253
//!   characters, labels of 1 to 63 characters not starting or ending with '-', and
//!   a top-level label that is not all digits;
//! - it is the input lowercased without one trailing dot, and parsing it again
//!   (with or without a trailing dot) gives the same name;
//! - placed in /etc/hosts or a Corefile it adds exactly one line, removable;
//! - a rejection says `hostname "<input escaped>": ...` on one line;
//! - an accepted ObjectName prints back as its input.
#![no_main]

use std::net::IpAddr;

use hairpin_agent::{
    k8s::ObjectName,
    names::{
        Hostname,
        corefile::{self, Rewrite},
        hosts::{self, HostsBlock},
    },
};
use libfuzzer_sys::fuzz_target;

const COREFILE: &str = ".:53 {\n    errors\n    forward . /etc/resolv.conf\n}\n";

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let input = input.as_ref();

    if let Ok(o) = input.parse::<ObjectName>() {
        assert_eq!(o.to_string(), input);
        assert!(!o.namespace.is_empty() && !o.name.is_empty());
        assert!(!o.name.contains('/'));
    }

    let host = match Hostname::parse(input) {
        Ok(host) => host,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("hostname {input:?}: ")), "{msg}");
            assert!(!msg.contains(['\n', '\r', '\0']), "{msg:?}");
            return;
        }
    };
    let name = host.as_str();
    let base = name.strip_prefix("*.").unwrap_or(name);
    assert_eq!(host.is_wildcard(), name.starts_with("*."));
    assert_eq!(host.base(), base);
    assert!(
        base.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.')),
        "{name:?}"
    );
    assert!(!name.contains(|c: char| c.is_whitespace() || "#{}\"';\\\0".contains(c)));
    assert!(!name.is_empty() && name.len() <= 253, "{name:?}");
    let labels: Vec<&str> = base.split('.').collect();
    for label in &labels {
        assert!((1..=63).contains(&label.len()), "{label:?} in {name:?}");
        assert!(!label.starts_with('-') && !label.ends_with('-'), "{name:?}");
    }
    let top = labels.last().expect("split gives one label at least");
    assert!(!top.bytes().all(|b| b.is_ascii_digit()), "{name:?}");
    let lowered = input.to_ascii_lowercase();
    assert_eq!(lowered.strip_suffix('.').unwrap_or(&lowered), name);
    assert_eq!(Hostname::parse(name).as_ref(), Ok(&host));
    assert_eq!(Hostname::parse(&format!("{name}.")).as_ref(), Ok(&host));
    assert_eq!(name.parse::<Hostname>().as_ref(), Ok(&host));

    // /etc/hosts: an exact name is one line between the markers, and goes away.
    let ip: IpAddr = "192.0.2.1".parse().expect("address");
    let (block, skipped) = HostsBlock::from_entries([(ip, host.clone())]);
    assert_eq!(skipped.len(), usize::from(host.is_wildcard()));
    let original = b"127.0.0.1\tlocalhost\n";
    let out = hosts::apply(original, &block).expect("editable");
    let added = out.split(|&b| b == b'\n').count() - original.split(|&b| b == b'\n').count();
    assert_eq!(added, if host.is_wildcard() { 0 } else { 3 });
    assert_eq!(hosts::remove(&out).as_deref(), Ok(&original[..]));

    // Corefile: one directive line, removable, whatever the name.
    let target = Hostname::parse("hairpin.hairpin-system.svc.cluster.local").expect("target");
    let rewrite = Rewrite::new(host.clone(), target.clone()).expect("exact target");
    let out = corefile::apply(COREFILE, &[rewrite.clone()]).expect("kubeadm Corefile");
    assert_eq!(out.lines().count(), COREFILE.lines().count() + 1);
    assert_eq!(corefile::remove(&out), COREFILE);
    assert_eq!(out.matches('{').count(), 1);
    assert_eq!(out.matches('}').count(), 1);
    // A wildcard cannot be a rewrite target.
    assert_eq!(
        Rewrite::new(target, host.clone()).is_err(),
        host.is_wildcard()
    );
});
