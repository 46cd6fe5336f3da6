//! The programs' counters as user space reads them: summed over CPUs, by counter or
//! by name, and a reader through a descriptor this process holds (for `/status` and
//! `/metrics`, which may not open the map by id).
//!
//! Owns the reading of the counters map. Never writes it (the programs do).

use aya::maps::{MapData, PerCpuArray};
use hairpin_ebpf::Counter;

/// The programs' counters, read through a descriptor this process holds (see
/// `Datapath::counters_reader`); valid while the process runs.
pub struct CountersReader(PerCpuArray<MapData, u64>);

impl CountersReader {
    /// A reader over `map`, a descriptor of the counters map this process holds.
    pub(crate) fn new(map: PerCpuArray<MapData, u64>) -> CountersReader {
        CountersReader(map)
    }
}

impl CountersReader {
    /// The per-CPU counters, summed, by name.
    pub fn read(&self) -> Vec<(&'static str, u64)> {
        sum_counters(&self.0)
            .into_iter()
            .map(|(c, v)| (c.name(), v))
            .collect()
    }

    /// The sockets map's fill as the counters tell it: sockets in the map (entered
    /// less left) and marked sockets not yet seen established. Each difference reads
    /// its subtrahends first, so a socket that moves on between the reads is never
    /// missed, only counted twice.
    pub(crate) fn fill(&self) -> Fill {
        let get = |c: Counter| -> u64 {
            self.0
                .get(&(c as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0)
        };
        let left = get(Counter::KernelSocketsLeft);
        let settled = get(Counter::KernelMissedInsert) + get(Counter::KernelMissedDataFirst);
        let entered = get(Counter::KernelSocketsEntered);
        let marked = get(Counter::KernelMarked);
        Fill {
            in_map: entered.saturating_sub(left),
            connecting: marked.saturating_sub(entered + settled),
        }
    }
}

pub(crate) fn sum_counters(map: &PerCpuArray<MapData, u64>) -> Vec<(Counter, u64)> {
    Counter::ALL
        .iter()
        .map(|c| {
            let total = map
                .get(&(*c as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0);
            (*c, total)
        })
        .collect()
}

/// [`sum_counters`] by counter name, as `status` and `dump` read a counters map
/// opened by pin or by id.
pub(crate) fn named_counters(map: &PerCpuArray<MapData, u64>) -> Vec<(&'static str, u64)> {
    sum_counters(map)
        .into_iter()
        .map(|(c, total)| (c.name(), total))
        .collect()
}

/// The sockets map's fill, from the counters ([`CountersReader::fill`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fill {
    /// Established marked sockets in the map: their header is not out yet.
    pub in_map: u64,
    /// Marked sockets not yet seen established (`kernel_marked` less those that
    /// entered the map or missed it at their handshake): handshakes under way, and
    /// connects that failed (which never settle). An estimate: a socket that entered
    /// and later missed its header by data first is counted on both sides.
    pub connecting: u64,
}
