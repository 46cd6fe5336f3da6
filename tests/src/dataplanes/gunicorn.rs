//! A server that reads PROXY v1 only: gunicorn (Debian's `gunicorn`, 20.1), the WSGI
//! server, with `--proxy-protocol`. Its parser takes the text line alone (`PROXY TCP4
//! ...`); a v2 header is an invalid request line to it. A tiny WSGI app answers with
//! what the header said: `REMOTE_ADDR`/`REMOTE_PORT` and gunicorn's `PROXY_ADDR`/
//! `PROXY_PORT` (the header's destination).

use std::fs;

use crate::{
    node::SimNode,
    servers::{Server, wait_listening_in},
    sh::command_in,
};

/// The WSGI app.
const APP: &str = r#"def app(environ, start_response):
    body = "client={}:{} dst={}:{}\n".format(
        environ.get("REMOTE_ADDR"), environ.get("REMOTE_PORT"),
        environ.get("PROXY_ADDR"), environ.get("PROXY_PORT")).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"#;

/// Starts gunicorn on `[::]:port` (IPv4 too) in `node`'s ingress namespace with the
/// PROXY protocol on, from any peer (gunicorn's allow list takes exact addresses
/// only); one sync worker. Waits until it listens.
pub fn start_gunicorn(node: &SimNode, port: u16) -> Server {
    let dir = node.dir.join("gunicorn");
    fs::create_dir_all(&dir).expect("gunicorn dir");
    fs::write(dir.join("echo_app.py"), APP).expect("the WSGI app");
    let bind = format!("[::]:{port}");
    let mut server = Server::spawn(
        &mut command_in(
            &node.ingress_ns,
            None,
            &[
                "gunicorn",
                "--chdir",
                dir.to_str().expect("utf-8 path"),
                "--proxy-protocol",
                "--proxy-allow-from",
                "*",
                "--bind",
                &bind,
                "--workers",
                "1",
                "--access-logfile",
                "-",
                "echo_app:app",
            ],
        ),
        dir.join("gunicorn.log"),
        &[],
    );
    wait_listening_in(&node.ingress_ns, &[port], Some(&mut server));
    server
}
