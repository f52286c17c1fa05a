//! A real `redis-server` for Rust tests, on its own unix socket in a fresh directory, so
//! tests run in parallel without ports or leftovers. Stopped and removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Server {
    child: Child,
    dir: PathBuf,
    /// What this server is started with beyond the common arguments.
    args: Vec<String>,
}

impl Server {
    /// Starts a server; `name` must be unique among the tests of one run.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, Vec::new())
    }

    fn start_with(name: &str, args: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("mastra-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let child = spawn(&dir, &args);
        let server = Self { child, dir, args };
        server.wait_ready();
        server
    }

    /// Starts a master and one replica of it, in sync. Replication runs over TCP (a replica
    /// cannot follow a unix socket), so the master also listens on a free loopback port;
    /// clients use the sockets, as everywhere else.
    pub fn start_with_replica(name: &str) -> (Self, Self) {
        let port = free_port();
        let master = Self::start_with(
            &format!("{name}-master"),
            vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                // A full sync starts at once, not after waiting for more replicas.
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ],
        );
        let replica = Self::start_with(
            &format!("{name}-replica"),
            vec!["--replicaof".into(), "127.0.0.1".into(), port.to_string()],
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
        (master, replica)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.cli(&["PING"]) != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a server that also takes TLS on a free loopback port, with the certificate and
    /// key in the files `cert` and `key`, trusting `ca` for client certificates, which it
    /// asks for when `auth_clients`. Answers it and the port.
    pub fn start_tls(
        name: &str,
        [cert, key, ca]: &[PathBuf; 3],
        auth_clients: bool,
    ) -> (Self, u16) {
        let port = free_port();
        let path = |file: &std::path::Path| file.display().to_string();
        let args = vec![
            "--tls-port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ];
        (Self::start_with(name, args), port)
    }

    /// Kills the server (SIGKILL: nothing saved) and starts a fresh one on the same socket.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Kills the server (SIGKILL: nothing saved); [`Server::start_again`] brings it back.
    pub fn kill(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.socket());
    }

    /// Starts a fresh server on the socket of one [`Server::kill`] stopped.
    pub fn start_again(&mut self) {
        self.child = spawn(&self.dir, &self.args);
        self.wait_ready();
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// Runs one command with `redis-cli` and returns its trimmed output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-s")
            .arg(self.socket())
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Calls of `command` so far, from `INFO commandstats` (commands scripts ran included).
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Sends a signal (`-STOP` freezes the server, `-CONT` thaws it).
    pub fn signal(&self, signal: &str) {
        Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
    }
}

/// A loopback TCP port nothing listens on (what the kernel hands out next; free for the
/// moment it takes the server to bind it).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A server on a unix socket in `dir`; no TCP unless `args` give a port (a later `--port`
/// wins over the first).
fn spawn(dir: &std::path::Path, args: &[String]) -> Child {
    Command::new("redis-server")
        .args(["--port", "0", "--save", "", "--appendonly", "no"])
        .arg("--unixsocket")
        .arg(dir.join("redis.sock"))
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be on the PATH")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
