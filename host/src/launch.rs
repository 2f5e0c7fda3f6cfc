//! Starting a job's ranks as local processes (what `devcomm-run` does).
//!
//! Each child gets torchrun's variables — `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`,
//! `MASTER_PORT=<a free port>` — plus `DEVCOMM_UNIQUE_ID` naming a bootstrap
//! root that this (launcher) process hosts, so the root outlives any rank
//! and a rank that dies is reported to the others. Children then call
//! [`Communicator::init_from_env`](crate::comm::Communicator::init_from_env).
//!
//! ```no_run
//! # fn main() -> devcomm::Result<()> {
//! use devcomm::launch::spawn_local;
//! let job = spawn_local(4, "./my-program", &["--size".into(), "1M".into()], &[])?;
//! let statuses = job.wait()?;
//! assert!(statuses.iter().all(|s| s.success()));
//! # Ok(()) }
//! ```

use crate::bootstrap::UniqueId;
use crate::env::UNIQUE_ID_ENV;
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How [`spawn`] starts and supervises a job.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LaunchOptions {
    /// Number of ranks.
    pub nprocs: usize,
    /// The program each rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables for every rank (applied last, so they can override).
    pub env: Vec<(OsString, OsString)>,
    /// Kill the other ranks as soon as one exits unsuccessfully (like torchrun).
    pub kill_on_failure: bool,
    /// Prefix every line a rank prints with `[rank R] ` (stdout to stdout, stderr to stderr).
    pub prefix_output: bool,
    /// Kill the whole job if it runs longer than this.
    pub timeout: Option<Duration>,
    /// Host a bootstrap root in this process and pass it as `DEVCOMM_UNIQUE_ID`.
    pub host_root: bool,
}

impl LaunchOptions {
    /// `nprocs` copies of `program`, killing all on failure, output prefixed, root hosted here.
    pub fn new(nprocs: usize, program: impl Into<OsString>) -> LaunchOptions {
        LaunchOptions {
            nprocs,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            kill_on_failure: true,
            prefix_output: true,
            timeout: None,
            host_root: true,
        }
    }

    /// Sets the arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an environment variable for every rank.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets [`LaunchOptions::kill_on_failure`].
    pub fn kill_on_failure(mut self, on: bool) -> Self {
        self.kill_on_failure = on;
        self
    }

    /// Sets [`LaunchOptions::prefix_output`].
    pub fn prefix_output(mut self, on: bool) -> Self {
        self.prefix_output = on;
        self
    }

    /// Sets [`LaunchOptions::timeout`].
    pub fn timeout(mut self, t: Option<Duration>) -> Self {
        self.timeout = t;
        self
    }

    /// Sets [`LaunchOptions::host_root`].
    pub fn host_root(mut self, on: bool) -> Self {
        self.host_root = on;
        self
    }
}

/// A running job of local processes.
#[derive(Debug)]
pub struct LocalJob {
    children: Vec<Child>,
    statuses: Vec<Option<ExitStatus>>,
    pumps: Vec<JoinHandle<()>>,
    unique_id: Option<UniqueId>,
    master_port: u16,
    kill_on_failure: bool,
    deadline: Option<Instant>,
}

/// Starts `n` ranks of `program args…` with [`LaunchOptions::new`]'s defaults
/// plus `extra_env`.
///
/// Errors: [`Error::InvalidArgument`] for `n == 0`; [`Error::SystemError`]
/// when a process cannot be started (the ones already started are killed).
pub fn spawn_local(n: usize, program: &str, args: &[String], extra_env: &[(String, String)]) -> Result<LocalJob> {
    let mut o = LaunchOptions::new(n, program).args(args.iter().cloned());
    for (k, v) in extra_env {
        o = o.env(k, v);
    }
    spawn(&o)
}

/// Starts a job as `opts` says.
pub fn spawn(opts: &LaunchOptions) -> Result<LocalJob> {
    let n = opts.nprocs;
    if n == 0 {
        return Err(Error::invalid_argument("a job needs at least one process"));
    }
    let master_port = free_port()?;
    let unique_id = if opts.host_root { Some(UniqueId::new()?) } else { None };
    let mut job = LocalJob {
        children: Vec::with_capacity(n),
        statuses: vec![None; n],
        pumps: Vec::new(),
        unique_id,
        master_port,
        kill_on_failure: opts.kill_on_failure,
        deadline: opts.timeout.map(|t| Instant::now() + t),
    };
    for rank in 0..n {
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", master_port.to_string())
            .env_remove("TORCHELASTIC_RUN_ID")
            .stdin(Stdio::null())
            // Each rank leads its own process group, so killing a rank kills
            // what it started too (and frees the output pipes).
            .process_group(0);
        match &unique_id {
            Some(id) => cmd.env(UNIQUE_ID_ENV, id.to_string()),
            None => cmd.env_remove(UNIQUE_ID_ENV),
        };
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if opts.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                job.kill_all();
                return Err(Error::system(format!("starting rank {rank} ({:?})", opts.program), e));
            }
        };
        if opts.prefix_output {
            if let Some(out) = child.stdout.take() {
                job.pumps.push(pump(rank, out, false));
            }
            if let Some(err) = child.stderr.take() {
                job.pumps.push(pump(rank, err, true));
            }
        }
        job.children.push(child);
    }
    Ok(job)
}

fn pump(rank: usize, stream: impl Read + Send + 'static, is_err: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    let mut buf = format!("[rank {rank}] ").into_bytes();
                    buf.extend_from_slice(&line);
                    let _ = if is_err {
                        std::io::stderr().lock().write_all(&buf)
                    } else {
                        std::io::stdout().lock().write_all(&buf)
                    };
                }
            }
        }
    })
}

/// A TCP port that was free a moment ago on 127.0.0.1.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::system("finding a free port", e))?;
    l.local_addr().map(|a| a.port()).map_err(|e| Error::system("finding a free port", e))
}

impl LocalJob {
    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether the job has no ranks (never true for a started job).
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Process ids, by rank.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// The id passed as `DEVCOMM_UNIQUE_ID`, when this process hosts the root.
    pub fn unique_id(&self) -> Option<UniqueId> {
        self.unique_id
    }

    /// The `MASTER_PORT` the ranks were given.
    pub fn master_port(&self) -> u16 {
        self.master_port
    }

    /// Kills rank `rank` with SIGKILL (no effect if it already exited).
    pub fn kill_rank(&mut self, rank: usize) -> Result<()> {
        let c = self
            .children
            .get_mut(rank)
            .ok_or_else(|| Error::invalid_argument(format!("no rank {rank} in a job of {}", self.statuses.len())))?;
        match c.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => c.kill().map_err(|e| Error::system(format!("killing rank {rank}"), e)),
        }
    }

    /// Kills every rank still running, with whatever processes it started
    /// (its process group), with SIGKILL.
    pub fn kill_all(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        for c in &mut self.children {
            let _ = killpg(nix::unistd::Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
        }
    }

    /// Waits for every rank; kills the others when one fails (if so
    /// configured) and everyone at the timeout. Returns the exit statuses by rank.
    ///
    /// Errors: [`Error::Timeout`] when the job ran past its timeout (all
    /// ranks were killed); [`Error::SystemError`] when waiting fails.
    pub fn wait(self) -> Result<Vec<ExitStatus>> {
        self.wait_report().map(|(s, _)| s)
    }

    /// As [`LocalJob::wait`], also returning the rank that failed first
    /// (the cause, when the others were then killed).
    pub fn wait_report(self) -> Result<(Vec<ExitStatus>, Option<usize>)> {
        self.wait_report_or_cancel(&AtomicBool::new(false))
    }

    /// As [`LocalJob::wait_report`]; additionally kills every rank once
    /// `cancel` becomes true (e.g. set from a SIGINT handler).
    pub fn wait_report_or_cancel(mut self, cancel: &AtomicBool) -> Result<(Vec<ExitStatus>, Option<usize>)> {
        let mut killed_for_timeout = false;
        let mut cancelled = false;
        let mut first_failed = None;
        loop {
            let mut running = 0;
            let mut failed = false;
            for (r, c) in self.children.iter_mut().enumerate() {
                if self.statuses[r].is_some() {
                    failed |= !self.statuses[r].is_some_and(|s| s.success());
                    continue;
                }
                match c.try_wait() {
                    Ok(Some(s)) => {
                        self.statuses[r] = Some(s);
                        if !s.success() {
                            failed = true;
                            first_failed.get_or_insert(r);
                        }
                    }
                    Ok(None) => running += 1,
                    Err(e) => return Err(Error::system(format!("waiting for rank {r}"), e)),
                }
            }
            if running == 0 {
                break;
            }
            if failed && self.kill_on_failure {
                self.kill_all();
            }
            if !killed_for_timeout && self.deadline.is_some_and(|d| Instant::now() >= d) {
                killed_for_timeout = true;
                self.kill_all();
            }
            if !cancelled && cancel.load(Ordering::SeqCst) {
                cancelled = true;
                self.kill_all();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Output still in the pipes is copied; a descendant that escaped the
        // process group and holds a pipe open is not waited for.
        let until = Instant::now() + Duration::from_secs(1);
        while self.pumps.iter().any(|p| !p.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        for p in self.pumps.drain(..) {
            if p.is_finished() {
                let _ = p.join();
            }
        }
        if killed_for_timeout {
            return Err(Error::Timeout("the job ran past its timeout and was killed".into()));
        }
        Ok((self.statuses.iter().map(|s| s.unwrap_or_default()).collect(), first_failed))
    }

    /// As [`LocalJob::wait`], then an error naming the first rank that did not succeed.
    ///
    /// Errors: [`Error::RemoteError`] for a failed rank, plus [`LocalJob::wait`]'s.
    pub fn wait_success(self) -> Result<()> {
        match self.wait_report()? {
            (st, Some(r)) => Err(Error::remote(format!("rank {r} {}", describe(&st[r])))),
            _ => Ok(()),
        }
    }
}

impl Drop for LocalJob {
    fn drop(&mut self) {
        self.kill_all();
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// "exited with code 3" / "was killed by signal 9".
pub fn describe(s: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended with {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_their_variables() {
        let o = LaunchOptions::new(3, "sh")
            .args(["-c", r#"test "$WORLD_SIZE" = 3 && test "$LOCAL_RANK" = "$RANK" && test -n "$DEVCOMM_UNIQUE_ID" && test "$X" = y && exit $RANK"#])
            .env("X", "y")
            .kill_on_failure(false);
        let st = spawn(&o).unwrap().wait().unwrap();
        let codes: Vec<_> = st.iter().map(|s| s.code()).collect();
        assert_eq!(codes, vec![Some(0), Some(1), Some(2)]);
    }

    #[test]
    fn one_failure_kills_the_rest() {
        let t = Instant::now();
        let args = vec!["-c".to_string(), r#"if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30"#.to_string()];
        let job = spawn_local(3, "sh", &args, &[]).unwrap();
        let st = job.wait().unwrap();
        assert_eq!(st[1].code(), Some(3));
        assert!(!st[0].success() && !st[2].success());
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(matches!(
            spawn_local(2, "sh", &args, &[]).unwrap().wait_success(),
            Err(Error::RemoteError(m)) if m.contains("rank 1 exited with code 3")
        ));
    }

    #[test]
    fn timeout_kills_everyone() {
        let o = LaunchOptions::new(2, "sleep").args(["30"]).timeout(Some(Duration::from_millis(200)));
        assert!(matches!(spawn(&o).unwrap().wait(), Err(Error::Timeout(_))));
    }

    #[test]
    fn bad_program_and_zero() {
        assert!(matches!(spawn_local(0, "true", &[], &[]), Err(Error::InvalidArgument(_))));
        assert!(matches!(spawn_local(2, "/nonexistent/devcomm-xyz", &[], &[]), Err(Error::SystemError(_))));
    }
}
