//! A TCP forwarder from the test process's network namespace into the node's: the
//! API server listens only inside the node namespace, where the node's components
//! reach it directly; the test's own client (and `kubectl`) connect to a loopback
//! port here, and the forwarder opens each upstream connection from a thread that
//! joined the node namespace (a socket belongs to the namespace of the thread that
//! made it).

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

/// The forwarder; stops accepting on drop (open connections end with their peers).
pub struct Forwarder {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 (an ephemeral port) and forwards every connection to
    /// `target` inside network namespace `netns`.
    pub fn start(netns: &str, target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the forwarder");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let netns = netns.to_string();
        thread::spawn(move || {
            crate::sh::enter_netns(&netns);
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                            Ok(upstream) => pipe(client, upstream),
                            // The API server is down (a restart test): the client sees
                            // the connection close, as it would a refused connect.
                            Err(_) => drop(client),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Forwarder { port, stop }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies both ways on two threads; each direction's end half-closes the other side.
fn pipe(a: TcpStream, b: TcpStream) {
    let (a2, b2) = (
        a.try_clone().expect("clone stream"),
        b.try_clone().expect("clone stream"),
    );
    thread::spawn(move || copy_then_close(a, b));
    thread::spawn(move || copy_then_close(b2, a2));
}

fn copy_then_close(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
