//! Reading a pinned datapath without owning it: `status` when no agent answers, and
//! `dump`. Works with the DaemonSet's own capabilities, inside the pod: pins are
//! opened by path (the kernel's by-id lookups need CAP_SYS_ADMIN), maps read-only
//! (`BPF_F_RDONLY`: nothing can be written through them), links read-write only
//! because the kernel opens no link otherwise, and only to read their info. Never
//! takes the pin directory's lock and never changes anything.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray};
use hairpin_ebpf::{
    FrontendKey, HEARTBEAT_BEAT, HEARTBEAT_TTL, MAP_COUNTERS, MAP_FRONTENDS, MAP_HEARTBEAT,
    Redirect,
};
use serde::{Deserialize, Serialize};

use super::liveness::{self, HeartbeatState};
use super::pin;
use super::role::Role;
use super::sys;

/// Why a pinned map could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InspectError {
    /// The pin could not be opened (absent, or no access to it).
    #[error("failed to open {}: {source}", path.display())]
    Open {
        /// The pin.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The pinned map is not what this build expects there.
    #[error("failed to read {}: {source}", path.display())]
    Read {
        /// The pin.
        path: PathBuf,
        /// aya's error (boxed: large).
        source: Box<aya::maps::MapError>,
    },
}

/// The map pinned at `path`, opened read-only.
pub(crate) fn open_map_read_only(path: &Path) -> Result<Map, InspectError> {
    let fd = sys::open_pinned_read_only(path).map_err(|source| InspectError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let read = |source| InspectError::Read {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let data = MapData::from_fd(fd).map_err(read)?;
    Map::from_map_data(data).map_err(read)
}

/// One link pinned in a layout directory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PinnedLink {
    /// The hook (`connect4`, `sock_ops`, ...).
    pub hook: String,
    /// The link's kernel id and the program it runs; `None` with `error`.
    pub link_id: Option<u32>,
    /// The program's kernel id.
    pub prog_id: Option<u32>,
    /// Whether its cgroup (or map) still exists: a link whose target is gone runs
    /// nothing.
    pub target_alive: Option<bool>,
    /// Why it could not be read.
    pub error: Option<String>,
}

/// One frontends map entry, as `dump` prints it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FrontendEntry {
    /// The LoadBalancer address a connect is aimed at.
    pub frontend: SocketAddr,
    /// The relay slot it is rewritten to, `#ADDRESS:PORT` (the index of the slot
    /// address among its family's, and the port).
    pub listener: String,
    /// What the entry does with a connect (`kernel v1`, `relay`, ...).
    pub path: String,
}

/// One pinned layout (`<pin dir>/v<N>`), read.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PinnedDatapath {
    /// The layout directory.
    pub dir: PathBuf,
    /// The links found, in the order hooks are linked.
    pub links: Vec<PinnedLink>,
    /// The heartbeat, in words (`live for 580s more`, `expired 12s ago`, ...).
    pub heartbeat: String,
    /// Whether the connect programs act (the heartbeat is live).
    pub live: bool,
    /// The counters summed over CPUs (empty when unreadable: see `errors`).
    pub counters: BTreeMap<String, u64>,
    /// The frontends map's entries (empty when unreadable: see `errors`).
    pub frontends: Vec<FrontendEntry>,
    /// Why a map could not be read.
    pub errors: Vec<String>,
}

/// Every layout pinned under `root`, read; empty when nothing is pinned there.
pub(crate) fn read_pinned(root: &Path) -> Vec<PinnedDatapath> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| pin::is_layout_dir(p))
        .collect();
    dirs.sort();
    dirs.into_iter().map(|d| read_layout(&d)).collect()
}

fn read_layout(dir: &Path) -> PinnedDatapath {
    let maps = dir.join("maps");
    let heartbeat = heartbeat_state(&maps.join(MAP_HEARTBEAT));
    let mut errors = Vec::new();
    let counters = read_counters(&maps.join(MAP_COUNTERS))
        .map(|c| c.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
        .unwrap_or_else(|e| {
            errors.push(e.to_string());
            BTreeMap::new()
        });
    let frontends = read_frontends(&maps.join(MAP_FRONTENDS)).unwrap_or_else(|e| {
        errors.push(e.to_string());
        Vec::new()
    });
    PinnedDatapath {
        dir: dir.to_path_buf(),
        links: Role::ALL
            .iter()
            .filter_map(|r| read_link(&dir.join("links").join(r.name()), r.name()))
            .collect(),
        live: matches!(heartbeat, HeartbeatState::Live(_)),
        heartbeat: heartbeat.to_string(),
        counters,
        frontends,
        errors,
    }
}

/// The link pinned at `path`, if one is.
fn read_link(path: &Path, hook: &str) -> Option<PinnedLink> {
    if std::fs::symlink_metadata(path).is_err() {
        return None;
    }
    let mut link = PinnedLink {
        hook: hook.to_string(),
        link_id: None,
        prog_id: None,
        target_alive: None,
        error: None,
    };
    match sys::open_pinned(path).and_then(|fd| sys::link_info(fd.as_fd())) {
        Ok(info) => {
            link.link_id = Some(info.id);
            link.prog_id = Some(info.prog_id);
            link.target_alive = Some(info.target_id != 0);
        }
        Err(e) => link.error = Some(format!("{}: {e}", path.display())),
    }
    Some(link)
}

/// The heartbeat pinned at `path`, read-only.
pub(crate) fn heartbeat_state(path: &Path) -> HeartbeatState {
    let Ok(map) = open_map_read_only(path) else {
        return HeartbeatState::Unreadable;
    };
    let Ok(map) = Array::<MapData, u64>::try_from(map) else {
        return HeartbeatState::Unreadable;
    };
    let (Ok(beat), Ok(ttl)) = (map.get(&HEARTBEAT_BEAT, 0), map.get(&HEARTBEAT_TTL, 0)) else {
        return HeartbeatState::Unreadable;
    };
    liveness::heartbeat_at(beat, ttl, liveness::monotonic_ns())
}

/// The counters map pinned at `path`, summed over CPUs.
pub(crate) fn read_counters(path: &Path) -> Result<Vec<(&'static str, u64)>, InspectError> {
    let map = PerCpuArray::<MapData, u64>::try_from(open_map_read_only(path)?).map_err(|e| {
        InspectError::Read {
            path: path.to_path_buf(),
            source: Box::new(e),
        }
    })?;
    Ok(super::counters::named_counters(&map))
}

/// The frontends map pinned at `path`, sorted.
pub(crate) fn read_frontends(path: &Path) -> Result<Vec<FrontendEntry>, InspectError> {
    let map: HashMap<MapData, FrontendKey, Redirect> = HashMap::try_from(open_map_read_only(path)?)
        .map_err(|e| InspectError::Read {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?;
    let mut out: Vec<FrontendEntry> = map
        .iter()
        .filter_map(Result::ok)
        .map(|(k, v)| FrontendEntry {
            frontend: k.socket_addr(),
            listener: v.slot().to_string(),
            path: super::kernel_path::describe(&v).to_string(),
        })
        .collect();
    out.sort_by(|a, b| (a.frontend, &a.listener).cmp(&(b.frontend, &b.listener)));
    Ok(out)
}
