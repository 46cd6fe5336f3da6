//! What a map an earlier agent pinned must be before it is adopted: the map this
//! build's object defines under that name (type, key and value size, flags, and the
//! size where the object fixes it). A pin that is not (planted by whoever could
//! write the pin directory, or left by a build that defined it otherwise) is never
//! handed to the programs: it is unpinned, said so, and made anew.

use std::path::{Path, PathBuf};

use aya::maps::MapInfo;
use hairpin_ebpf::{MAP_COUNTERS, MAP_FRONTENDS, MAP_SLOTS, MAP_SOCKETS};

/// The maps whose size is set at load (flags, or the sockets map's own, adopted
/// size) or may be shorter (counters added within a layout): their size is not
/// compared.
const SIZED_AT_LOAD: [&str; 4] = [MAP_FRONTENDS, MAP_SLOTS, MAP_SOCKETS, MAP_COUNTERS];

/// A map's definition, as the object has it or the kernel reports a pinned one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MapDef {
    pub(super) map_type: u32,
    pub(super) key_size: u32,
    pub(super) value_size: u32,
    pub(super) max_entries: u32,
    pub(super) flags: u32,
}

impl MapDef {
    /// What differs between `self` (pinned) and `want` (the object's), `None` when
    /// nothing that matters does.
    pub(super) fn differs(&self, want: &MapDef, compare_size: bool) -> Option<String> {
        let mut diffs = Vec::new();
        let mut field = |name: &str, have: u32, want: u32| {
            if have != want {
                diffs.push(format!("{name} {have}, expected {want}"));
            }
        };
        field("type", self.map_type, want.map_type);
        field("key size", self.key_size, want.key_size);
        field("value size", self.value_size, want.value_size);
        field("flags", self.flags, want.flags);
        if compare_size {
            field("max entries", self.max_entries, want.max_entries);
        }
        (!diffs.is_empty()).then(|| diffs.join(", "))
    }
}

/// The definitions of `names` in `object`; empty when it does not parse (loading
/// it says why).
fn defined(object: &[u8], names: &[&str]) -> Vec<(String, MapDef)> {
    let Ok(obj) = aya_obj::Object::parse(object) else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|n| {
            let m = obj.maps.get(*n)?;
            Some((
                (*n).to_string(),
                MapDef {
                    map_type: m.map_type(),
                    key_size: m.key_size(),
                    value_size: m.value_size(),
                    max_entries: m.max_entries(),
                    flags: m.map_flags(),
                },
            ))
        })
        .collect()
}

/// The definition of the map pinned at `path`, `None` when nothing is pinned there
/// (or it is not a map).
fn pinned(path: &Path) -> Option<MapDef> {
    let info = MapInfo::from_pin(path).ok()?;
    Some(MapDef {
        map_type: info.map_type().ok()? as u32,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
        flags: info.map_flags(),
    })
}

/// Unpins every map in `pins` (name, path) that is not what `object` defines, and
/// says so; what is right, or absent, is left for the loader to adopt or make.
/// Returns the names of the maps unpinned.
pub(super) fn refuse_foreign(object: &[u8], pins: &[(&'static str, PathBuf)]) -> Vec<String> {
    let names: Vec<&str> = pins.iter().map(|(n, _)| *n).collect();
    let defs = defined(object, &names);
    let mut refused = Vec::new();
    for (name, path) in pins {
        let Some((_, want)) = defs.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let Some(have) = pinned(path) else {
            continue;
        };
        let Some(why) = have.differs(want, !SIZED_AT_LOAD.contains(name)) else {
            continue;
        };
        tracing::warn!(
            map = name,
            pin = %path.display(),
            differs = %why,
            "a pinned map is not the one this build defines: not adopted, unpinned and made anew"
        );
        if let Err(e) = super::pin::unpin(path) {
            tracing::warn!(map = name, error = %e, "could not unpin it: the load fails rather than adopt it");
        }
        refused.push((*name).to_string());
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: MapDef = MapDef {
        map_type: 1,
        key_size: 8,
        value_size: 16,
        max_entries: 1024,
        flags: 1,
    };

    #[test]
    fn every_field_that_matters_is_named_and_the_size_only_where_fixed() {
        assert_eq!(HASH.differs(&HASH, true), None);
        let other = MapDef {
            map_type: 2,
            value_size: 4,
            max_entries: 1,
            ..HASH
        };
        assert_eq!(
            other.differs(&HASH, true).as_deref(),
            Some("type 2, expected 1, value size 4, expected 16, max entries 1, expected 1024")
        );
        let resized = MapDef {
            max_entries: 4096,
            ..HASH
        };
        assert_eq!(resized.differs(&HASH, false), None);
        assert!(resized.differs(&HASH, true).is_some());
    }
}
