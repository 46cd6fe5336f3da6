//! Starting the relay of frontends, and saying in `/status`, the log and the
//! metrics which family it does not serve and why: a listener that could not bind
//! (every port of its range taken, the address not on the node, no
//! CAP_NET_BIND_SERVICE) or no sk_lookup program (a kernel before 5.9). Either way
//! the agent serves everything else, and the connect programs send nothing to a
//! listener that is not there: the family's relayed connects go as before hairpin.
//! A listener that could not bind or register is tried again with the failed
//! frontends' backoff ([`RelayRetry`]).

use std::{io, net::IpAddr, sync::Arc};

use tracing::{info, warn};

use crate::{
    agent::reconcile::ListenAddresses,
    datapath::Datapath,
    model::ProxyVersion,
    names::relay::NameRouting,
    relay::{ListenHook, Relay, RelayConfig, RelayError, SlotLookup},
    status::{RelayStatus, UnservedFamily, UnservedStep, metrics::Metrics},
};

/// What to do when the relay's slots cannot reach its listeners.
const STEERING_FIX: &str = "the relay's slots need the hairpin_sk_lookup program: Linux 5.9 or \
     later, and CAP_BPF with CAP_NET_ADMIN; until then use the kernel path for these frontends \
     (path: kernel, Linux 5.19+) or the name relay (--mode both: /etc/hosts, CoreDNS)";

/// The relay of frontends: where a datapath runs, its sk_lookup program is linked,
/// then one listener per family listens on a privileged port of the family's first
/// listen address (none in `avoid`), registered in the liveness map as it binds, as
/// the name relay's redirected listeners will be: the connect programs send to a
/// slot only while its listener is there. Each connection is relayed to the
/// frontend its slot names in the slots map. The relay, what `/status` says of it
/// (`None` without a datapath: no relay of frontends runs), and what it takes to
/// try a failed listener again.
pub(super) fn start_relay(
    config: RelayConfig,
    datapath: Option<&mut Datapath>,
    names: Option<&mut NameRouting>,
    listen: ListenAddresses,
    avoid: &[u16],
    metrics: &Metrics,
) -> (Relay, Option<RelayStatus>, Option<RelayRetry>) {
    let mut relay = Relay::new(config, metrics.clone());
    let Some(d) = datapath else {
        return (relay, None, None);
    };
    let families = [("IPv4", listen.v4), ("IPv6", listen.v6)];
    // Every family with an address, unserved for `what`: `error`.
    let all_unserved = |what: UnservedStep, error: &str, fix: &str| {
        let unserved = families
            .iter()
            .filter_map(|(family, ip)| {
                ip.map(|ip| UnservedFamily {
                    family: family.to_string(),
                    address: Some(ip),
                    what,
                    error: error.into(),
                    fix: fix.into(),
                })
            })
            .collect();
        Some(RelayStatus {
            listeners: Vec::new(),
            unserved,
        })
    };
    let steered = match d.steering() {
        Ok(()) => d.steer_slots().map_err(|e| e.to_string()),
        Err(why) => Err(why.to_string()),
    };
    if let Err(why) = steered {
        // No listener is registered, so the connect programs send nothing to a slot:
        // relayed frontends go as before hairpin; the kernel path is unaffected.
        warn!(reason = %why, fix = STEERING_FIX,
            "the relay's slots cannot reach its listeners: relayed connects go as before hairpin");
        return (
            relay,
            all_unserved(UnservedStep::Steering, &why, STEERING_FIX),
            None,
        );
    }
    let liveness = d.relay_liveness();
    let hook: ListenHook =
        Arc::new(move |index, addr, fd| liveness.register(index, addr, fd).map_err(Into::into));
    if let Some(n) = names {
        n.on_listen(hook.clone());
    }
    let reader = match d.slots_reader() {
        Ok(r) => r,
        Err(e) => {
            let fix = "see the agent's log; restart the agent (the pod)";
            warn!(error = %e, "the relay cannot read the slots map: relayed connects go as before hairpin");
            return (
                relay,
                all_unserved(UnservedStep::Slots, &e.to_string(), fix),
                None,
            );
        }
    };
    let lookup: crate::relay::SlotLookup = crate::relay::refusing_targets(Arc::new(move |local| {
        let owner = reader.owner(local)?;
        Some((owner.frontend, ProxyVersion::from_number(owner.version)?))
    }));
    let mut status = RelayStatus::default();
    for (family, ip) in families {
        let Some(ip) = ip else { continue };
        match relay.listen(ip, listener_index(ip), avoid, &hook, lookup.clone()) {
            Ok(local) => status.listeners.push(local),
            Err(e) => {
                let unserved = unserved_by(family, ip, &e);
                warn!(family, address = %ip, error = %e, fix = %unserved.fix,
                    "the relay's listener is not served: relayed connects of this family go as before hairpin (retried with backoff)");
                status.unserved.push(unserved);
            }
        }
    }
    let retry = RelayRetry {
        hook,
        lookup,
        avoid: avoid.to_vec(),
    };
    (relay, Some(status), Some(retry))
}

/// What it takes to try a relay listener that could not bind or register again.
pub(crate) struct RelayRetry {
    hook: ListenHook,
    lookup: SlotLookup,
    avoid: Vec<u16>,
}

impl RelayRetry {
    /// How many families of `status` are worth trying again (see
    /// [`UnservedStep::retried`]).
    pub(crate) fn pending(status: &RelayStatus) -> usize {
        status.unserved.iter().filter(|u| u.what.retried()).count()
    }

    /// Tries each such family of `status` again, moving those that bind to its
    /// listeners (and updating the error of the others).
    pub(crate) fn retry(&self, relay: &mut Relay, status: &mut RelayStatus) {
        let listeners = &mut status.listeners;
        status.unserved.retain_mut(|u| {
            let (Some(ip), true) = (u.address, u.what.retried()) else {
                return true;
            };
            match relay.listen(
                ip,
                listener_index(ip),
                &self.avoid,
                &self.hook,
                self.lookup.clone(),
            ) {
                Ok(local) => {
                    info!(family = %u.family, %local, "the relay's listener is served again");
                    listeners.push(local);
                    false
                }
                Err(e) => {
                    *u = unserved_by(&u.family, ip, &e);
                    true
                }
            }
        });
    }
}

/// The liveness map's slot of the relay's listener on `ip`'s family.
fn listener_index(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        hairpin_ebpf::LISTENER_RELAY4
    } else {
        hairpin_ebpf::LISTENER_RELAY6
    }
}

/// What `/status` says of a listener of `family` on `ip` that failed with `e`.
fn unserved_by(family: &str, ip: IpAddr, e: &RelayError) -> UnservedFamily {
    let (what, error, fix) = match e {
        RelayError::Listen { source, .. } => {
            (UnservedStep::Bind, source.to_string(), bind_fix(ip, source))
        }
        RelayError::Register { source, .. } => (
            UnservedStep::Register,
            source.to_string(),
            "the liveness map refused the listener: see the agent's log; the agent tries again \
             on its own (1 s doubling to 30 s)"
                .to_string(),
        ),
    };
    UnservedFamily {
        family: family.to_string(),
        address: Some(ip),
        what,
        error,
        fix,
    }
}

/// What to do about a listener on `ip` that could not bind. A flag or a
/// capability changes with the pod; a port freed or an address that comes up is
/// found by the agent's own retries.
fn bind_fix(ip: IpAddr, e: &io::Error) -> String {
    let retried = "the agent tries again on its own (1 s doubling to 30 s)";
    match e.kind() {
        io::ErrorKind::PermissionDenied => "give the agent CAP_NET_BIND_SERVICE (the DaemonSet \
             adds it), then restart it (the pod)"
            .to_string(),
        io::ErrorKind::AddrNotAvailable => format!(
            "{ip} is not an address of this node: let the agent put it on a link \
             (--listen-link, the default); never pass a node IP or any address the node \
             uses for something else as --listen-address (the agent refuses it: its \
             slots would take that address's connections); once it is there {retried}"
        ),
        _ => format!(
            "every port of 512-1023 on {ip} is taken (a listener on the wildcard address \
             takes the port on every address: `ss -ltnp 'sport >= 512 and sport <= 1023'`): \
             free one ({retried}) or move the relay with --listen-address"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_bind_names_the_os_error_and_the_fix_for_its_kind() {
        let ip: IpAddr = "fd68:6169:7270:696e::1".parse().expect("ip");
        let taken = RelayError::Listen {
            ip,
            source: io::Error::from_raw_os_error(nix::libc::EADDRINUSE),
        };
        let u = unserved_by("IPv6", ip, &taken);
        assert_eq!((u.family.as_str(), u.what.as_str()), ("IPv6", "bind"));
        assert!(u.error.contains("os error 98"), "{}", u.error);
        assert!(
            u.fix.contains("ss -ltnp") && u.fix.contains("tries again"),
            "{}",
            u.fix
        );
        let missing = RelayError::Listen {
            ip,
            source: io::Error::from_raw_os_error(nix::libc::EADDRNOTAVAIL),
        };
        let u = unserved_by("IPv6", ip, &missing);
        assert!(u.fix.contains("--listen-link"), "{}", u.fix);
        let denied = RelayError::Listen {
            ip,
            source: io::Error::from_raw_os_error(nix::libc::EACCES),
        };
        assert!(
            unserved_by("IPv6", ip, &denied)
                .fix
                .contains("CAP_NET_BIND_SERVICE")
        );
    }
}
