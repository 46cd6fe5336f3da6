//! What the kernel says about hairpin's programs, links and maps, found by id and
//! name rather than through a loaded [`crate::datapath::Datapath`]: the agent's `/status`
//! reports these ids, and the node CLI reads the same objects when the agent is down.

use aya::{
    maps::{Map, MapData, MapInfo, PerCpuArray, loaded_maps},
    programs::{ProgramInfo, loaded_links, loaded_programs},
};
use hairpin_ebpf::{MAP_COUNTERS, MAP_FRONTENDS, PROG_CONNECT4};
use serde::{Deserialize, Serialize};

use crate::status::{KernelIds, ProgramIds};

/// Errors reading kernel objects.
#[derive(Debug, thiserror::Error)]
pub enum KernelObjectsError {
    /// A map could not be opened or read.
    #[error("failed to {op} bpf map id {id}: {source}")]
    Map {
        /// `open` or `read`.
        op: &'static str,
        /// The map id.
        id: u32,
        /// aya's error (boxed: large).
        source: Box<aya::maps::MapError>,
    },
    /// Programs could not be enumerated (usually: no CAP_SYS_ADMIN/CAP_BPF).
    #[error("failed to list bpf programs: {0}")]
    Programs(#[source] Box<aya::programs::ProgramError>),
    /// Links could not be enumerated (kernels before 5.8, or no CAP_BPF).
    #[error("failed to list bpf links: {0}")]
    Links(#[source] Box<aya::programs::links::LinkError>),
}

impl KernelObjectsError {
    /// True when the map no longer exists (ENOENT opening it by id): it was freed
    /// between being listed and being opened, as an exiting agent's maps are.
    pub(crate) fn is_gone(&self) -> bool {
        match self {
            Self::Map {
                op: "open", source, ..
            } => matches!(
                source.as_ref(),
                aya::maps::MapError::SyscallError(aya::sys::SyscallError { io_error, .. })
                    if io_error.raw_os_error() == Some(libc::ENOENT)
            ),
            _ => false,
        }
    }
}

/// The kernel's object names: BPF_OBJ_NAME_LEN is 16 with the NUL, so names are cut to
/// 15 bytes (`HAIRPIN_FRONTENDS` is `HAIRPIN_FRONTEN`; both programs are `hairpin_connect`).
pub(crate) fn kernel_name(name: &str) -> &str {
    name.get(..15).unwrap_or(name)
}

/// One hairpin map found in the kernel.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FoundMap {
    /// Kernel map id.
    pub id: u32,
    /// Kernel (truncated) name.
    pub name: String,
}

/// Every bpf link the kernel lists, as (program id, link id). Kernels before 5.8
/// cannot list links: that is an error, not an empty list. A link freed between
/// being listed and being opened (another tool's, going away) is skipped.
pub(crate) fn links() -> Result<Vec<(u32, u32)>, KernelObjectsError> {
    let mut found = Vec::new();
    let mut first_error = None;
    for l in loaded_links() {
        match l {
            Ok(l) => found.push((l.program_id(), l.id())),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if found.is_empty() => Err(KernelObjectsError::Links(Box::new(e))),
        _ => Ok(found),
    }
}

/// Ids for `programs` (ELF name, kernel info), with their links found by listing.
pub(crate) fn ids_of(programs: &[(&str, ProgramInfo)]) -> KernelIds {
    let links = links().unwrap_or_default();
    let mut ids = KernelIds::default();
    for (name, info) in programs {
        let map_ids = info.map_ids().ok().flatten().unwrap_or_default();
        for id in &map_ids {
            match MapInfo::from_id(*id)
                .ok()
                .as_ref()
                .and_then(|m| m.name_as_str())
            {
                Some(n) if n == kernel_name(MAP_FRONTENDS) => ids.frontends_map_id = Some(*id),
                Some(n) if n == kernel_name(MAP_COUNTERS) => ids.counters_map_id = Some(*id),
                _ => {}
            }
        }
        ids.programs.push(ProgramIds {
            name: name.to_string(),
            program_id: info.id(),
            link_ids: links
                .iter()
                .filter(|(p, _)| *p == info.id())
                .map(|(_, l)| *l)
                .collect(),
            map_ids,
        });
    }
    ids
}

/// Every loaded program named like hairpin's, with links and maps: what is in the
/// kernel whether or not an agent answers.
pub(crate) fn hairpin_programs() -> Result<Vec<ProgramIds>, KernelObjectsError> {
    let mut found = Vec::new();
    for p in loaded_programs() {
        let p = p.map_err(|e| KernelObjectsError::Programs(Box::new(e)))?;
        if p.name_as_str() == Some(kernel_name(PROG_CONNECT4)) {
            found.push(("hairpin_connect", p));
        }
    }
    let named: Vec<(&str, ProgramInfo)> = found;
    Ok(ids_of(&named).programs)
}

/// Every loaded program named like hairpin's, by program id, with its accumulated
/// run time and run count as the kernel keeps them while BPF run-time statistics are
/// enabled ([`enable_run_time_stats`] or the `kernel.bpf_stats_enabled` sysctl).
pub fn hairpin_program_run_stats() -> Vec<(u32, RunStats)> {
    loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(kernel_name(PROG_CONNECT4)))
        .map(|p| {
            let stats = RunStats {
                run_time_ns: u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX),
                run_count: p.run_count(),
            };
            (p.id(), stats)
        })
        .collect()
}

/// Counters of one program's runs (see [`hairpin_program_run_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Nanoseconds spent running it, summed over runs.
    pub run_time_ns: u64,
    /// Times it ran.
    pub run_count: u64,
}

/// Turns BPF run-time statistics on for as long as the returned descriptor is open
/// (BPF_ENABLE_STATS; needs CAP_SYS_ADMIN). Each program run then costs two clock reads.
pub fn enable_run_time_stats() -> Result<std::os::fd::OwnedFd, aya::sys::SyscallError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
}

/// Every loaded map named like hairpin's frontends or counters map.
pub(crate) fn hairpin_maps() -> Vec<FoundMap> {
    loaded_maps()
        .filter_map(Result::ok)
        .filter_map(|m| {
            let name = m.name_as_str()?;
            (name == kernel_name(MAP_FRONTENDS) || name == kernel_name(MAP_COUNTERS)).then(|| {
                FoundMap {
                    id: m.id(),
                    name: name.to_string(),
                }
            })
        })
        .collect()
}

/// The bpf map ids process `pid` holds open, from /proc/PID/fdinfo (`map_id:` lines).
pub(crate) fn map_ids_of_pid(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue; // the fd closed between listing and reading
        };
        ids.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("map_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

fn open(id: u32) -> Result<Map, KernelObjectsError> {
    let data = MapData::from_id(id).map_err(|e| KernelObjectsError::Map {
        op: "open",
        id,
        source: Box::new(e),
    })?;
    Map::from_map_data(data).map_err(|e| KernelObjectsError::Map {
        op: "open",
        id,
        source: Box::new(e),
    })
}

/// The counters map `id`, summed over CPUs, by counter name.
pub fn read_counters(id: u32) -> Result<Vec<(&'static str, u64)>, KernelObjectsError> {
    let map: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open(id)?).map_err(|e| KernelObjectsError::Map {
            op: "read",
            id,
            source: Box::new(e),
        })?;
    Ok(super::counters::named_counters(&map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_cut_to_fifteen_bytes() {
        assert_eq!(kernel_name(MAP_FRONTENDS), "HAIRPIN_FRONTEN");
        assert_eq!(kernel_name(MAP_COUNTERS), "HAIRPIN_COUNTER");
        assert_eq!(kernel_name(PROG_CONNECT4), "hairpin_connect");
        assert_eq!(kernel_name("short"), "short");
    }

    #[test]
    fn this_process_holds_no_maps() {
        assert_eq!(
            map_ids_of_pid(std::process::id()).expect("fdinfo"),
            Vec::<u32>::new()
        );
    }

    fn open_error(errno: i32) -> KernelObjectsError {
        KernelObjectsError::Map {
            op: "open",
            id: 7,
            source: Box::new(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_get_fd_by_id",
                io_error: std::io::Error::from_raw_os_error(errno),
            })),
        }
    }

    #[test]
    fn only_a_map_missing_at_open_is_gone() {
        assert!(open_error(libc::ENOENT).is_gone());
        assert!(!open_error(libc::EPERM).is_gone());
        let KernelObjectsError::Map { source, id, .. } = open_error(libc::ENOENT) else {
            unreachable!()
        };
        let read = KernelObjectsError::Map {
            op: "read",
            id,
            source,
        };
        assert!(!read.is_gone());
    }
}
