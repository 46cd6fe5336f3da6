use super::*;
use crate::datapath::lifecycle::decide::HANDSHAKE_SETTLE;

fn unavailable(why: KernelPathUnavailable) -> KernelPath {
    KernelPath::Unavailable(Arc::new(why))
}

/// A program the verifier refused.
fn refused() -> KernelPathUnavailable {
    KernelPathUnavailable::Load {
        name: PROG_SK_MSG,
        detail: "x".into(),
        note: "",
    }
}

/// The states in which no header is written in the kernel.
fn not_on() -> [KernelPath; 2] {
    [
        KernelPath::Off,
        unavailable(KernelPathUnavailable::NoProgramType("sk_msg")),
    ]
}

fn fills(seq: Vec<Fill>) -> impl Fn() -> Fill {
    let seq = std::sync::Mutex::new(seq.into_iter());
    let last = std::sync::Mutex::new(Fill::default());
    move || {
        let next = seq.lock().expect("lock").next();
        let mut last = last.lock().expect("lock");
        if let Some(f) = next {
            *last = f;
        }
        *last
    }
}

fn fill(in_map: u64, connecting: u64) -> Fill {
    Fill { in_map, connecting }
}

#[tokio::test(start_paused = true)]
async fn the_kernel_drain_ends_when_the_map_empties() {
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(20);
    let read = fills(vec![fill(2, 0), fill(2, 0), fill(1, 0), fill(0, 0)]);
    assert_eq!(drain_kernel_sockets(read, deadline).await, 0);
    assert!(start.elapsed() < Duration::from_millis(100));
    // An empty map at once, nothing connecting: no wait at all.
    let read = fills(vec![fill(0, 0)]);
    let start = tokio::time::Instant::now();
    assert_eq!(drain_kernel_sockets(read, deadline).await, 0);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn the_kernel_drain_gives_handshakes_under_way_time_to_enter_the_map() {
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(20);
    // A connect that never settles (it failed): waited for HANDSHAKE_SETTLE.
    assert_eq!(
        drain_kernel_sockets(fills(vec![fill(0, 1)]), deadline).await,
        0
    );
    let waited = start.elapsed();
    assert!(
        waited >= HANDSHAKE_SETTLE && waited < HANDSHAKE_SETTLE + FILL_POLL * 2,
        "{waited:?}"
    );
    // One that enters the map, then writes: waited for until it left.
    let start = tokio::time::Instant::now();
    let read = fills(vec![fill(0, 1), fill(1, 0), fill(1, 0), fill(0, 0)]);
    assert_eq!(drain_kernel_sockets(read, deadline).await, 0);
    assert!(start.elapsed() < HANDSHAKE_SETTLE);
}

#[tokio::test(start_paused = true)]
async fn the_kernel_drain_gives_up_at_the_deadline_with_the_sockets_left() {
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(2);
    assert_eq!(
        drain_kernel_sockets(fills(vec![fill(1, 0)]), deadline).await,
        1
    );
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    // A deadline shorter than the settle time still holds.
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_millis(300);
    assert_eq!(
        drain_kernel_sockets(fills(vec![fill(0, 3)]), deadline).await,
        0
    );
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[test]
fn a_refusal_without_cap_perfmon_names_it() {
    assert!(perfmon_note(Some(false)).contains("no CAP_PERFMON"));
    assert_eq!(perfmon_note(Some(true)), "");
    assert_eq!(perfmon_note(None), "");
    assert!(has_perfmon().is_some());
}

#[test]
fn a_version_number_reads_back_and_no_other_byte_is_a_version() {
    for v in [ProxyVersion::V1, ProxyVersion::V2] {
        assert_eq!(ProxyVersion::from_number(v.number()), Some(v));
    }
    assert_eq!(ProxyVersion::from_number(0), None);
    assert_eq!(ProxyVersion::from_number(HEADER_RELAY_SERVER_FIRST), None);
}

#[test]
fn dump_says_what_each_map_value_does() {
    let l = SlotRef {
        addr: 0,
        port: 40000,
        listener: 0,
    };
    let words: Vec<&str> = [
        Redirect::kernel(l, HEADER_V1),
        Redirect::kernel(l, HEADER_V2),
        Redirect::new(l, 1),
        Redirect::server_first(l, 1),
        Redirect::relay_chosen(l, 1),
    ]
    .iter()
    .map(describe)
    .collect();
    assert_eq!(
        words,
        [
            "kernel v1",
            "kernel v2",
            "relay",
            "relay (server speaks first)",
            "relay (hairpin.dev/path)"
        ]
    );
}

#[test]
fn a_server_first_frontend_is_relayed_even_with_the_kernel_path_on() {
    let l = SlotRef {
        addr: 0,
        port: 40000,
        listener: 0,
    };
    for version in [ProxyVersion::V1, ProxyVersion::V2] {
        let v = KernelPath::On.value(l, version, FirstSpeaker::Server, PathChoice::Auto);
        assert_eq!(v, Redirect::server_first(l, version.number()));
        assert!(!v.is_kernel());
        for off in not_on() {
            assert_eq!(
                off.value(l, version, FirstSpeaker::Server, PathChoice::Auto),
                Redirect::new(l, version.number())
            );
        }
    }
    assert!(
        KernelPath::On
            .why(FirstSpeaker::Server, PathChoice::Auto)
            .is_some_and(|w| w.starts_with("relay: the server speaks first"))
    );
    assert_eq!(
        KernelPath::On
            .why(FirstSpeaker::Client, PathChoice::Auto)
            .as_deref(),
        Some("kernel: the client speaks first")
    );
    assert_eq!(
        KernelPath::Off.why(FirstSpeaker::Server, PathChoice::Auto),
        None
    );
    assert!(
        unavailable(refused())
            .why(FirstSpeaker::Client, PathChoice::Auto)
            .is_some_and(|w| w.starts_with("relay: "))
    );
}

#[test]
fn the_value_carries_the_header_only_when_the_kernel_path_is_on() {
    let l = SlotRef {
        addr: 0,
        port: 40000,
        listener: 0,
    };
    let (client, auto) = (FirstSpeaker::Client, PathChoice::Auto);
    assert_eq!(
        KernelPath::On.value(l, ProxyVersion::V1, client, auto),
        Redirect::kernel(l, HEADER_V1)
    );
    assert_eq!(
        KernelPath::On.value(l, ProxyVersion::V2, client, auto),
        Redirect::kernel(l, HEADER_V2)
    );
    for off in not_on() {
        assert_eq!(
            off.value(l, ProxyVersion::V2, client, auto),
            Redirect::new(l, 2)
        );
        assert_eq!(off.connect_programs(), [PROG_CONNECT4, PROG_CONNECT6]);
    }
    assert_eq!(
        KernelPath::On.connect_programs(),
        [PROG_CONNECT4_KERNEL, PROG_CONNECT6_KERNEL]
    );
    assert_eq!(
        unavailable(KernelPathUnavailable::NoProgramType("sk_msg")).to_string(),
        "unavailable: this kernel has no sk_msg programs"
    );
}

#[test]
fn a_frontend_asking_for_the_relay_is_relayed_with_its_own_header_byte() {
    let l = SlotRef {
        addr: 0,
        port: 40000,
        listener: 0,
    };
    let relay = PathChoice::Relay;
    for version in [ProxyVersion::V1, ProxyVersion::V2] {
        let v = KernelPath::On.value(l, version, FirstSpeaker::Client, relay);
        assert_eq!(v, Redirect::relay_chosen(l, version.number()));
        assert!(!v.is_kernel());
        assert_eq!(describe(&v), "relay (hairpin.dev/path)");
        // A server that speaks first needs the relay whatever was asked: that
        // is the reason given.
        assert_eq!(
            KernelPath::On.value(l, version, FirstSpeaker::Server, relay),
            Redirect::server_first(l, version.number())
        );
        for off in not_on() {
            assert_eq!(
                off.value(l, version, FirstSpeaker::Client, relay),
                Redirect::new(l, version.number())
            );
        }
    }
    assert_eq!(
        KernelPath::On.why(FirstSpeaker::Client, relay).as_deref(),
        Some("relay: the Service asks for it (hairpin.dev/path: relay)")
    );
    assert!(
        KernelPath::On
            .why(FirstSpeaker::Server, relay)
            .is_some_and(|w| w.starts_with("relay: the server speaks first"))
    );
    assert_eq!(KernelPath::Off.why(FirstSpeaker::Client, relay), None);
    assert_eq!(
        unavailable(refused())
            .why(FirstSpeaker::Client, relay)
            .as_deref(),
        Some("relay: the kernel path is unavailable on this node")
    );
}

/// The kind `status` reports follows the cause, and the words are the cause's own.
#[test]
fn an_unavailable_kernel_path_takes_its_kind_and_words_from_its_cause() {
    let link = KernelPathUnavailable::LinkFailed(DatapathError::NotEmbedded);
    assert_eq!(link.kind(), KernelPathReason::LinkFailed);
    assert_eq!(
        unavailable(link).to_string(),
        format!("unavailable: {}", DatapathError::NotEmbedded)
    );
    assert_eq!(refused().kind(), KernelPathReason::Refused);
    assert_eq!(
        KernelPathUnavailable::Missing(PROG_SOCK_OPS).kind(),
        KernelPathReason::NotInObject
    );
}
