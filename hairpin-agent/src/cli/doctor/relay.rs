//! `doctor`'s check of the relay of frontends: every family served, or which is not,
//! why (the OS error, or the sk_lookup program missing) and what to do. Read from
//! the agent's `/status`.

use super::{Check, Status};
use crate::status::{FrontendState, Snapshot};

/// `relay`: fails when a family the node has a listen address for is not served:
/// its relayed frontends (and the kernel path's fallbacks to the relay) go as
/// before hairpin until it is fixed.
pub(crate) fn relay_check(agent: Option<&Snapshot>) -> Check {
    let name = "relay";
    let Some(s) = agent else {
        return Check::new(name, Status::Skip, "needs the running agent (its relay)");
    };
    let Some(r) = &s.relay else {
        return Check::new(
            name,
            Status::Skip,
            "no relay of frontends runs (no eBPF datapath on this node)",
        );
    };
    let listening: Vec<String> = r.listeners.iter().map(ToString::to_string).collect();
    if r.unserved.is_empty() {
        return Check::new(
            name,
            Status::Ok,
            format!("listening on {}", listening.join(", ")),
        );
    }
    let failed: Vec<String> = s
        .frontends
        .iter()
        // The agent lists them failed with the family's sentence first.
        .filter(|f| {
            f.state == FrontendState::Failed
                && f.reason
                    .as_deref()
                    .is_some_and(|w| r.unserved.iter().any(|u| w.starts_with(&u.describe())))
        })
        .map(|f| std::net::SocketAddr::new(f.ip, f.port).to_string())
        .collect();
    let detail: Vec<String> = r.unserved.iter().map(|u| u.describe()).collect();
    let fixes: Vec<String> = r
        .unserved
        .iter()
        .map(|u| format!("{}: {}", u.family, u.fix))
        .collect();
    let mut detail = detail.join("; ");
    if !failed.is_empty() {
        detail.push_str(&format!("; not served: {}", failed.join(", ")));
    }
    if !listening.is_empty() {
        detail.push_str(&format!("; listening on {}", listening.join(", ")));
    }
    Check::new(name, Status::Fail, detail).fix(fixes.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{FrontendStatus, RelayStatus, UnservedFamily, UnservedStep};

    fn unserved(family: &str, address: &str, what: UnservedStep, error: &str) -> UnservedFamily {
        UnservedFamily {
            family: family.into(),
            address: Some(address.parse().expect("ip")),
            what,
            error: error.into(),
            fix: format!("fix {family}"),
        }
    }

    #[test]
    fn an_unserved_family_fails_naming_its_error_frontends_and_fix() {
        let mut s = Snapshot::default();
        assert_eq!(relay_check(Some(&s)).status, Status::Skip);
        s.relay = Some(RelayStatus {
            listeners: vec!["169.254.104.1:1023".parse().expect("addr")],
            unserved: Vec::new(),
        });
        let ok = relay_check(Some(&s));
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        ok.assert_detail_names(&["169.254.104.1:1023"]);
        let u = unserved(
            "IPv6",
            "fd68:6169:7270:696e::1",
            UnservedStep::Bind,
            "Address in use (os error 98)",
        );
        s.frontends = vec![FrontendStatus::failed_for_test(
            "[2001:db8:ffff::12]:80",
            &format!("{}; {}", u.describe(), u.fix),
            None,
        )];
        s.relay.as_mut().expect("relay").unserved.push(u);
        let c = relay_check(Some(&s));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        c.assert_detail_names(&[
            "IPv6 listener is not served on fd68:6169:7270:696e::1",
            "os error 98",
            "not served: [2001:db8:ffff::12]:80",
            "listening on 169.254.104.1:1023",
        ]);
        c.assert_fix_names(&["IPv6: fix IPv6"]);
    }

    #[test]
    fn no_sk_lookup_fails_both_families_with_the_reason() {
        let mut s = Snapshot::default();
        let why = "hairpin_sk_lookup did not load (sk_lookup programs need Linux 5.9): EINVAL";
        s.relay = Some(RelayStatus {
            listeners: Vec::new(),
            unserved: vec![
                unserved("IPv4", "169.254.104.1", UnservedStep::Steering, why),
                unserved(
                    "IPv6",
                    "fd68:6169:7270:696e::1",
                    UnservedStep::Steering,
                    why,
                ),
            ],
        });
        let c = relay_check(Some(&s));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        c.assert_detail_names(&["IPv4 listener", "IPv6 listener", "steering", "Linux 5.9"]);
    }
}
