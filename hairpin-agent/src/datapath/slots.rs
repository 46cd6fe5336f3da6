//! The relay's slots (see `hairpin_ebpf::slot`): the slot addresses, the slots map's
//! one writer ([`SlotTable`], the reconciler's: which slot each frontend is served
//! on, handed out so that no slot ever serves two frontends while a connect aimed at
//! it may still arrive), the relay's reader ([`SlotsReader`]: whose slot a connection
//! came to, at accept). (The sk_lookup program that hands connections aimed at slots
//! to the relay's listeners is the loaded programs' own, programs.rs.)
//!
//! Owns `HAIRPIN_SLOTS` ([`Slots`]). Never touches the frontends map, a cgroup link
//! or the pin directory.

use std::{
    collections::{HashMap as StdHashMap, HashSet, VecDeque},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsFd,
    sync::Arc,
};

use aya::maps::{HashMap, MapData};
use hairpin_ebpf::{
    AF_INET, AF_INET6, MAP_SLOTS, SLOT_ADDRS, SLOT_PORT_MIN, SLOT_QUARANTINE_NS, Slot, SlotKey,
    SlotRef,
};

use super::error::{DatapathError, is_full, map_error};
use super::liveness::monotonic_ns;

/// The relay's slot addresses per family: the listen addresses (the first of each
/// family also holds the relay's listener), written into the object at load. Each
/// gives [`hairpin_ebpf::SLOTS_PER_ADDR`] slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlotAddrs {
    /// IPv4 slot addresses, at most [`SLOT_ADDRS`].
    pub v4: Vec<Ipv4Addr>,
    /// IPv6 slot addresses, at most [`SLOT_ADDRS`].
    pub v6: Vec<Ipv6Addr>,
}

impl SlotAddrs {
    /// The slot addresses among `addrs`, in order, at most [`SLOT_ADDRS`] per family.
    pub(crate) fn of(addrs: &[IpAddr]) -> SlotAddrs {
        let mut out = SlotAddrs::default();
        for a in addrs {
            match a {
                IpAddr::V4(v) if out.v4.len() < SLOT_ADDRS && !out.v4.contains(v) => {
                    out.v4.push(*v)
                }
                IpAddr::V6(v) if out.v6.len() < SLOT_ADDRS && !out.v6.contains(v) => {
                    out.v6.push(*v)
                }
                _ => {}
            }
        }
        out
    }

    /// How many slot addresses `family` has.
    fn count(&self, family: u8) -> usize {
        if family == AF_INET {
            self.v4.len()
        } else {
            self.v6.len()
        }
    }

    /// The address of slot address `index` of `family`.
    fn addr(&self, family: u8, index: u8) -> Option<IpAddr> {
        let i = usize::from(index);
        if family == AF_INET {
            self.v4.get(i).map(|a| IpAddr::V4(*a))
        } else {
            self.v6.get(i).map(|a| IpAddr::V6(*a))
        }
    }

    /// Where a client is sent for `slot` of `family`: its address and port.
    pub(crate) fn socket_addr(&self, family: u8, slot: SlotRef) -> Option<SocketAddr> {
        self.addr(family, slot.addr)
            .map(|ip| SocketAddr::new(ip, slot.port))
    }

    /// The slot a connection accepted at `local` came to (an IPv4 one through a
    /// mapped address too), if `local` is on a slot address.
    pub(crate) fn key_of(&self, local: SocketAddr) -> Option<SlotKey> {
        let (family, index) = match local.ip().to_canonical() {
            IpAddr::V4(ip) => (AF_INET, self.v4.iter().position(|a| *a == ip)?),
            IpAddr::V6(ip) => (AF_INET6, self.v6.iter().position(|a| *a == ip)?),
        };
        Some(SlotKey {
            port: local.port().to_be(),
            addr: u8::try_from(index).ok()?,
            family,
        })
    }
}

/// The family a frontend's slot is in: its own (an IPv4-mapped address counts as IPv4).
fn family_of(frontend: SocketAddr) -> u8 {
    if frontend.ip().to_canonical().is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    }
}

/// The next free slot of `family` from `cursor` on (round robin, so a freed slot is
/// handed out again as late as possible): not in `used`, not an `avoid` port, on
/// one of `addrs` addresses. None when every slot is taken.
pub(super) fn next_free(
    family: u8,
    addrs: usize,
    used: &HashSet<SlotKey>,
    avoid: &[u16],
    cursor: &mut (u8, u16),
) -> Option<SlotKey> {
    let per_addr = u32::from(u16::MAX - SLOT_PORT_MIN) + 1;
    let total = u32::try_from(addrs).ok()? * per_addr;
    if total == 0 {
        return None;
    }
    let start = u32::from(cursor.0.min(SLOT_ADDRS as u8)) * per_addr
        + u32::from(cursor.1.max(SLOT_PORT_MIN) - SLOT_PORT_MIN);
    for step in 0..total {
        let n = (start + step) % total;
        let addr = u8::try_from(n / per_addr).ok()?;
        let port = SLOT_PORT_MIN + u16::try_from(n % per_addr).ok()?;
        let key = SlotKey {
            port: port.to_be(),
            addr,
            family,
        };
        if avoid.contains(&port) || used.contains(&key) {
            continue;
        }
        *cursor = match port.checked_add(1) {
            Some(next) => (addr, next),
            None => (addr + 1, SLOT_PORT_MIN),
        };
        return Some(key);
    }
    None
}

/// Why a slot could not be bound.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlotError {
    /// No slot address of the frontend's family.
    #[error("no {family} slot address: pass --listen-address with one")]
    NoAddress {
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// Every slot of the family is bound, or in its quarantine.
    #[error(
        "every {family} relay slot is taken ({addresses} slot address(es) of 64,512 ports, \
         retired ones held 3 minutes): add a --listen-address of that family"
    )]
    Exhausted {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// How many slot addresses it has.
        addresses: usize,
    },
    /// The frontend's namespace holds its cap of slots, live and retired together:
    /// its new frontends wait for its own retired slots to be free, never another
    /// namespace's.
    #[error(
        "namespace {namespace} holds {held} relay slots, its cap (its live frontends' and those \
         retired within the last 3 minutes; twice --max-frontends-per-namespace): its new \
         frontends wait until its retired slots are free"
    )]
    NamespaceFull {
        /// The namespace.
        namespace: String,
        /// The slots it holds (its cap).
        held: usize,
    },
    /// The slots map refused the entry.
    #[error(transparent)]
    Map(#[from] DatapathError),
}

/// The slots map's one writer, and which slot each live frontend holds.
pub(crate) struct SlotTable {
    map: HashMap<MapData, SlotKey, Slot>,
    addrs: SlotAddrs,
    /// Ports never handed out: the names ports, where the names address is a slot
    /// address and the name relay binds them as they are.
    avoid: Vec<u16>,
    /// The slot of every live frontend (and names port), by what clients dial.
    live: StdHashMap<SocketAddr, SlotKey>,
    /// Every key in the map, live or retired.
    used: HashSet<SlotKey>,
    /// Retired slots by when they retired, oldest first.
    retired: VecDeque<(u64, SlotKey)>,
    /// The retired slot of each frontend that has one: a frontend back within its
    /// quarantine takes its own slot again (no other frontend may).
    retired_of: StdHashMap<SocketAddr, SlotKey>,
    /// Where the next search starts, per family (IPv4, IPv6).
    cursors: [(u8, u16); 2],
    /// Per family, whether the last search found every slot taken and none was
    /// freed since: a full family then fails at once instead of searching all of
    /// its slots again for every frontend still waiting.
    full: [bool; 2],
    /// The namespace each slot (live or retired) is charged to, where it is a
    /// Service's: a slot bound for the operator's frontends file or a names port,
    /// or adopted retired from an earlier agent, is charged to none.
    charged: StdHashMap<SlotKey, Arc<str>>,
    /// How many slots each namespace holds, live and retired together.
    held: StdHashMap<Arc<str>, usize>,
    /// The most slots one namespace may hold, live and retired together (see
    /// [`SlotTable::cap_namespaces`]): a namespace churning fresh addresses through
    /// the quarantine fills its own share, never the slots of every other.
    namespace_cap: usize,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("addrs", &self.addrs)
            .field("live", &self.live.len())
            .field("used", &self.used.len())
            .finish_non_exhaustive()
    }
}

impl SlotTable {
    /// The table over `map` as an earlier agent may have left it: every slot there
    /// stays bound to its frontend (live ones for this agent to take again, retired
    /// ones until their quarantine ends), so no slot changes hands at a restart.
    fn adopt(map: HashMap<MapData, SlotKey, Slot>, addrs: SlotAddrs, avoid: Vec<u16>) -> Self {
        let mut t = SlotTable {
            map,
            addrs,
            avoid,
            live: StdHashMap::new(),
            used: HashSet::new(),
            retired: VecDeque::new(),
            retired_of: StdHashMap::new(),
            cursors: [(0, SLOT_PORT_MIN); 2],
            full: [false; 2],
            charged: StdHashMap::new(),
            held: StdHashMap::new(),
            namespace_cap: usize::MAX,
        };
        let mut retired: Vec<(u64, SlotKey, SocketAddr)> = Vec::new();
        let entries: Vec<(SlotKey, Slot)> = t.map.iter().filter_map(Result::ok).collect();
        for (key, slot) in entries {
            t.used.insert(key);
            if slot.retired != 0 {
                retired.push((slot.retired_at, key, slot.frontend()));
            } else if let Some(earlier) = t.live.insert(slot.frontend(), key) {
                // Two live slots for one frontend (never written so): keep one.
                retired.push((0, earlier, slot.frontend()));
            }
            let cursor = &mut t.cursors[usize::from(key.family != AF_INET)];
            let next = (key.addr, u16::from_be(key.port).saturating_add(1));
            *cursor = (*cursor).max(next);
        }
        // Oldest first: a frontend retired twice keeps its latest slot to come back to.
        retired.sort();
        for &(_, key, frontend) in &retired {
            if !t.live.contains_key(&frontend) {
                t.retired_of.insert(frontend, key);
            }
        }
        t.retired = retired.into_iter().map(|(at, key, _)| (at, key)).collect();
        t
    }

    /// Caps the slots one namespace may hold, live and retired together, at `cap`
    /// (the agent passes twice `--max-frontends-per-namespace`: room to replace
    /// every frontend once within a quarantine).
    pub(crate) fn cap_namespaces(&mut self, cap: usize) {
        self.namespace_cap = cap;
    }

    /// Charges `key` to `namespace` (none: to nobody), moving it from whoever it
    /// was charged to.
    fn charge(&mut self, key: SlotKey, namespace: Option<&str>) {
        if self.charged.get(&key).map(|n| &**n) == namespace {
            return;
        }
        self.uncharge(key);
        if let Some(ns) = namespace {
            let ns: Arc<str> = self
                .held
                .get_key_value(ns)
                .map_or_else(|| Arc::from(ns), |(k, _)| k.clone());
            *self.held.entry(ns.clone()).or_insert(0) += 1;
            self.charged.insert(key, ns);
        }
    }

    /// Charges `key` to nobody.
    fn uncharge(&mut self, key: SlotKey) {
        if let Some(ns) = self.charged.remove(&key)
            && let Some(n) = self.held.get_mut(&ns)
        {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&ns);
            }
        }
    }

    /// How many slots `namespace` holds, live and retired.
    pub(crate) fn held_by(&self, namespace: &str) -> usize {
        self.held.get(namespace).copied().unwrap_or(0)
    }

    /// Binds a slot to `frontend` (what clients dial), handed to relay listener
    /// `listener` with `version` headers, charged to `namespace` (a Service's; none
    /// for the frontends file and the names ports): the one it holds already (an
    /// earlier agent's too, or its own retired one), else a free one while the
    /// namespace holds fewer than its cap. Where clients are sent for it.
    pub(crate) fn bind(
        &mut self,
        frontend: SocketAddr,
        listener: u8,
        version: u8,
        namespace: Option<&str>,
    ) -> Result<(SlotRef, SocketAddr), SlotError> {
        let family = family_of(frontend);
        let name = if family == AF_INET { "IPv4" } else { "IPv6" };
        if self.addrs.count(family) == 0 {
            return Err(SlotError::NoAddress { family: name });
        }
        let wanted = Slot::live(frontend, listener, version);
        let exhausted = SlotError::Exhausted {
            family: name,
            addresses: self.addrs.count(family),
        };
        let fam = usize::from(family != AF_INET);
        let key = match (self.live.get(&frontend), self.retired_of.get(&frontend)) {
            (Some(key), _) | (None, Some(key)) => *key,
            (None, None) => {
                // Before the family's own state: a namespace at its cap is told so.
                if let Some(ns) = namespace
                    && self.held_by(ns) >= self.namespace_cap
                {
                    return Err(SlotError::NamespaceFull {
                        namespace: ns.to_string(),
                        held: self.held_by(ns),
                    });
                }
                if self.full[fam] {
                    return Err(exhausted);
                }
                let found = next_free(
                    family,
                    self.addrs.count(family),
                    &self.used,
                    &self.avoid,
                    &mut self.cursors[fam],
                );
                self.full[fam] = found.is_none();
                found.ok_or(exhausted)?
            }
        };
        let current = self.map.get(&key, 0).ok();
        if current != Some(wanted) {
            self.map.insert(key, wanted, 0).map_err(|e| {
                if is_full(&e) {
                    SlotError::Exhausted {
                        family: name,
                        addresses: self.addrs.count(family),
                    }
                } else {
                    SlotError::Map(map_error("insert", MAP_SLOTS, frontend.to_string())(e))
                }
            })?;
        }
        self.used.insert(key);
        self.live.insert(frontend, key);
        self.retired_of.remove(&frontend);
        self.charge(key, namespace);
        let slot = SlotRef {
            addr: key.addr,
            port: u16::from_be(key.port),
            listener,
        };
        let at = self
            .addrs
            .socket_addr(family, slot)
            .ok_or(SlotError::NoAddress { family: name })?;
        Ok((slot, at))
    }

    /// Retires `frontend`'s slot (after its redirect is gone): connections still
    /// aimed at it reach it for [`SLOT_QUARANTINE_NS`], then it is free.
    pub(crate) fn retire(&mut self, frontend: SocketAddr) {
        let Some(key) = self.live.remove(&frontend) else {
            return;
        };
        let now = monotonic_ns();
        match self.map.get(&key, 0) {
            Ok(mut slot) => {
                slot.retired = 1;
                slot.retired_at = now;
                if let Err(e) = self.map.insert(key, slot, 0) {
                    tracing::warn!(%frontend, error = %e, "a retired slot could not be marked so; it stays bound to its frontend");
                }
            }
            Err(e) => tracing::debug!(%frontend, error = %e, "a retired slot was not in the map"),
        }
        self.retired.push_back((now, key));
        self.retired_of.insert(frontend, key);
    }

    /// Retires every live slot but those of `keep`: an earlier agent's, for
    /// frontends that went away while no agent ran.
    pub(crate) fn retire_all_but(&mut self, keep: &std::collections::BTreeSet<SocketAddr>) {
        let gone: Vec<SocketAddr> = self
            .live
            .keys()
            .filter(|f| !keep.contains(f))
            .copied()
            .collect();
        let mut said = crate::logs::LogBudget::default();
        for f in &gone {
            crate::item!(said, info, frontend = %f, "an earlier agent's slot for a frontend that is gone: retired");
            self.retire(*f);
        }
        said.more(|n| tracing::info!(more = n, "and more of an earlier agent's slots for frontends that are gone: retired (each at log level debug)"));
    }

    /// Frees the retired slots whose quarantine ended (`now`: `CLOCK_MONOTONIC` ns).
    pub(crate) fn sweep(&mut self, now: u64) {
        while let Some(&(at, key)) = self.retired.front() {
            if now.saturating_sub(at) < SLOT_QUARANTINE_NS {
                break;
            }
            self.retired.pop_front();
            let slot = self.map.get(&key, 0).ok();
            // Taken again meanwhile by its frontend (back within its quarantine), or
            // retired again since (a later entry frees it): kept.
            if slot.is_some_and(|s| s.retired == 0 || s.retired_at > at) {
                continue;
            }
            let _ = self.map.remove(&key);
            self.used.remove(&key);
            self.uncharge(key);
            self.full[usize::from(key.family != AF_INET)] = false;
            if let Some(s) = slot
                && self.retired_of.get(&s.frontend()) == Some(&key)
            {
                self.retired_of.remove(&s.frontend());
            }
        }
        // A mass retirement (an agent restarted with a partial set) grows these to
        // the node's whole set; give the room back once they are mostly empty.
        if self.retired_of.len() < self.retired_of.capacity() / 4 {
            self.retired_of.shrink_to_fit();
        }
        if self.retired.len() < self.retired.capacity() / 4 {
            self.retired.shrink_to_fit();
        }
    }
}

/// What the relay needs of a connection's slot: whose it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotOwner {
    /// The frontend the slot serves (the names address and port for a names slot).
    pub frontend: SocketAddr,
    /// The PROXY version its relay writes.
    pub version: u8,
    /// The relay listener it is handed to.
    pub listener: u8,
}

/// The relay's reader of the slots map: whose slot a connection came to.
#[derive(Clone)]
pub(crate) struct SlotsReader {
    map: Arc<HashMap<MapData, SlotKey, Slot>>,
    addrs: SlotAddrs,
}

impl SlotsReader {
    /// The owner of the slot a connection accepted at `local` came to; None when
    /// `local` is no slot, or no frontend holds it.
    pub(crate) fn owner(&self, local: SocketAddr) -> Option<SlotOwner> {
        let key = self.addrs.key_of(local)?;
        let slot = self.map.get(&key, 0).ok()?;
        Some(SlotOwner {
            frontend: slot.frontend(),
            version: slot.version,
            listener: slot.listener,
        })
    }
}

/// The slots map until its one writer is handed out, a descriptor of it for the
/// relay's readers, and the slot addresses the object was loaded with.
pub(crate) struct Slots {
    map: Option<HashMap<MapData, SlotKey, Slot>>,
    fd: std::os::fd::OwnedFd,
    addrs: SlotAddrs,
}

impl Slots {
    /// The slots map `map` (`fd`: a descriptor of it of its own) over `addrs`.
    pub(crate) fn new(
        map: HashMap<MapData, SlotKey, Slot>,
        fd: std::os::fd::OwnedFd,
        addrs: SlotAddrs,
    ) -> Slots {
        Slots {
            map: Some(map),
            fd,
            addrs,
        }
    }

    /// Hands the slots map's one writer to its owner (the reconciler), with the
    /// slots an earlier agent bound; `avoid`: ports never to hand out. `None` once
    /// taken.
    pub(crate) fn take(&mut self, avoid: Vec<u16>) -> Option<SlotTable> {
        let map = self.map.take()?;
        Some(SlotTable::adopt(map, self.addrs.clone(), avoid))
    }

    /// A reader of the slots map for the relay's accept path.
    pub(crate) fn reader(&self) -> Result<SlotsReader, DatapathError> {
        let open = |e| map_error("open", MAP_SLOTS, String::new())(e);
        let fd = self.fd.as_fd().try_clone_to_owned().map_err(|io_error| {
            open(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "dup",
                io_error,
            }))
        })?;
        let data = MapData::from_fd(fd).map_err(open)?;
        let map = HashMap::try_from(aya::maps::Map::HashMap(data)).map_err(open)?;
        Ok(SlotsReader {
            map: Arc::new(map),
            addrs: self.addrs.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(family: u8, addr: u8, port: u16) -> SlotKey {
        SlotKey {
            port: port.to_be(),
            addr,
            family,
        }
    }

    #[test]
    fn slots_are_handed_out_round_robin_skipping_used_and_avoided_ports() {
        let mut used = HashSet::new();
        let mut cursor = (0, SLOT_PORT_MIN);
        let a = next_free(AF_INET, 2, &used, &[1025], &mut cursor).expect("a slot");
        assert_eq!(a, key(AF_INET, 0, 1024));
        used.insert(a);
        let b = next_free(AF_INET, 2, &used, &[1025], &mut cursor).expect("a slot");
        assert_eq!(b, key(AF_INET, 0, 1026), "1025 is avoided");
        // Freeing the first does not hand it out again before the cursor wraps.
        used.insert(b);
        used.remove(&a);
        let c = next_free(AF_INET, 2, &used, &[1025], &mut cursor).expect("a slot");
        assert_eq!(c, key(AF_INET, 0, 1027));
        // The last port of an address moves on to the next address.
        let mut cursor = (0, u16::MAX);
        let d = next_free(AF_INET6, 2, &used, &[], &mut cursor).expect("a slot");
        assert_eq!(d, key(AF_INET6, 0, u16::MAX));
        assert_eq!(cursor, (1, SLOT_PORT_MIN));
    }

    #[test]
    fn a_full_family_has_no_free_slot_and_none_without_an_address() {
        let mut used = HashSet::new();
        for port in SLOT_PORT_MIN..=u16::MAX {
            used.insert(key(AF_INET, 0, port));
        }
        let mut cursor = (0, 5000);
        assert_eq!(next_free(AF_INET, 1, &used, &[], &mut cursor), None);
        assert_eq!(
            next_free(AF_INET, 2, &used, &[], &mut cursor),
            Some(key(AF_INET, 1, SLOT_PORT_MIN))
        );
        assert_eq!(next_free(AF_INET, 0, &used, &[], &mut cursor), None);
    }

    #[test]
    fn a_slot_address_names_its_slots_and_nothing_else() {
        let addrs = SlotAddrs::of(&[
            "169.254.104.1".parse().expect("ip"),
            "fd68::1".parse().expect("ip"),
            "169.254.104.2".parse().expect("ip"),
            "169.254.104.1".parse().expect("ip"),
        ]);
        assert_eq!(addrs.v4.len(), 2, "duplicates count once");
        let slot = SlotRef {
            addr: 1,
            port: 4242,
            listener: 0,
        };
        let at = addrs.socket_addr(AF_INET, slot).expect("an address");
        assert_eq!(at, "169.254.104.2:4242".parse().expect("addr"));
        assert_eq!(addrs.key_of(at), Some(key(AF_INET, 1, 4242)));
        let mapped = "[::ffff:169.254.104.2]:4242".parse().expect("addr");
        assert_eq!(addrs.key_of(mapped), Some(key(AF_INET, 1, 4242)));
        assert_eq!(
            addrs.key_of("[fd68::1]:1024".parse().expect("addr")),
            Some(key(AF_INET6, 0, 1024))
        );
        assert_eq!(addrs.key_of("10.0.0.1:4242".parse().expect("addr")), None);
        assert_eq!(
            addrs.socket_addr(AF_INET6, SlotRef { addr: 1, ..slot }),
            None
        );
    }
}
