//! The static frontends file (`--frontends FILE`, `agent::parse_frontends_file`) over arbitrary
//! text: frontends and the `hosts` lists the name relay and /etc/hosts use.
//!
//! Invariants:
//! - never panics, whatever YAML (deep nesting, anchors, odd scalars);
//! - an error names the file, and a validation error the entry and field;
//! - an accepted frontend is a unicast LB address with a TCP port in 1..=65535,
//!   attributed to the file;
//! - routes parse only where frontends parse, and each route is a valid hostname
//!   on one of the file's own frontends' LBs and ports, inside the names scope
//!   (`--names-domains`; the always-refused names never come through).
#![no_main]

use std::path::Path;

use hairpin_agent::{
    agent::{
        FrontendsFileError, parse_frontends_file as parse,
        parse_frontends_file_routes as parse_routes,
    },
    names::{Hostname, NameScope},
};
use libfuzzer_sys::fuzz_target;

const FILE: &str = "fuzz/frontends.yaml";

fn check_error(e: &FrontendsFileError) {
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("frontends file {FILE}: ")),
        "{msg}"
    );
    match e {
        FrontendsFileError::Invalid {
            field, expected, ..
        } => {
            assert!(msg.contains(&format!("].{field}: ")), "{msg}");
            assert!(!expected.is_empty());
        }
        FrontendsFileError::InvalidHost { source, .. } => {
            assert!(msg.contains("].hosts["), "{msg}");
            assert!(msg.ends_with(&source.to_string()));
        }
        FrontendsFileError::Conflict { first, .. } => {
            assert!(msg.contains("].ports["), "{msg}");
            assert!(first.starts_with("frontends["), "{msg}");
        }
        FrontendsFileError::Parse { message, .. } => assert!(!message.is_empty()),
        FrontendsFileError::Read { .. } => panic!("parsing text never reads"),
    }
}

fuzz_target!(|data: &[u8]| {
    // The file is read with read_to_string: non-UTF-8 never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(FILE);
    let scope =
        NameScope::new(&["example.com", "a.io", "x.y.z"], "cluster.local").expect("a valid scope");
    let frontends = match parse(path, text) {
        Ok(f) => f,
        Err(e) => {
            check_error(&e);
            let routes = parse_routes(path, text, &scope).expect_err("routes need valid frontends");
            check_error(&routes);
            return;
        }
    };
    for f in &frontends {
        assert!(f.port != 0, "{f:?}");
        assert!(!f.ip.is_unspecified() && !f.ip.is_loopback() && !f.ip.is_multicast());
        assert!(
            f.source.to_string().starts_with(&format!("file {FILE}")),
            "{}",
            f.source
        );
    }
    match parse_routes(path, text, &scope) {
        Ok(routes) => {
            for r in &routes.routes {
                assert_eq!(Hostname::parse(r.host.as_str()).as_ref(), Ok(&r.host));
                assert_eq!(scope.check(&r.host), Ok(()), "{r:?}");
                assert!(!r.ports.is_empty());
                for port in &r.ports {
                    assert!(
                        frontends
                            .iter()
                            .any(|f| f.ip == r.lb && f.port == *port && f.version == r.version),
                        "route {r:?} is not on a frontend of the file"
                    );
                }
            }
        }
        Err(e) => {
            assert!(matches!(e, FrontendsFileError::InvalidHost { .. }), "{e}");
            check_error(&e);
        }
    }
});
