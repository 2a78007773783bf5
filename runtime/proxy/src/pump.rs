//! Relaying bytes both ways with byte counters and an idle timeout.
//!
//! Each direction moves data socket -> pipe -> socket with `splice(2)`: the payload stays in
//! kernel pages and never crosses into the proxy's memory, which is what lets a proxied
//! transfer keep up with a direct one (a read/write copy loop costs two extra copies per byte
//! on a machine whose cores the client and server already keep busy). The first 64 KiB of a
//! direction go through a small buffer, so short exchanges (one request, one small answer)
//! never pay for a pipe. If a pipe cannot be made (descriptor limits), that direction goes on
//! with the copy loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes one `splice` call moves at most, and the pipe size asked for. A larger pipe means
/// fewer system calls per megabyte; pipe pages are only held while data is in flight.
const PIPE_SIZE: usize = 256 * 1024;

/// Buffer size of the fallback copy loop.
const BUF_SIZE: usize = 64 * 1024;

/// Bytes relayed so far and the time of the last activity, readable while the relay runs.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    last_activity_ms: AtomicU64,
    start: Instant,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Self {
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_activity_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = self.last_activity_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }

    fn moved(&self, count: &AtomicU64, n: usize) {
        count.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.touch();
    }
}

/// How a relay ended.
#[derive(Debug)]
pub(crate) enum PumpEnd {
    /// Both sides closed their sending half.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
    /// A read or write failed (reset, broken pipe).
    Failed(io::Error),
}

/// A non-blocking pipe: the kernel-side buffer one direction splices through.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A bigger pipe is an optimisation only: past the per-user pipe memory limit the
        // kernel refuses, and the default 64 KiB still works.
        let size = i32::try_from(PIPE_SIZE).unwrap_or(i32::MAX);
        let _ = fcntl(write.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(size));
        Ok(Self { read, write })
    }
}

/// Passes the end of one direction on: no more data will be sent to `to`.
fn shutdown_write(to: &TcpStream) -> io::Result<()> {
    match nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write) {
        Ok(()) | Err(nix::errno::Errno::ENOTCONN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Moves up to `len` bytes from `from` to `to` once `from` (or `to`) is ready.
async fn splice_ready(
    socket: &TcpStream,
    interest: Interest,
    from: impl AsFd + Copy,
    to: impl AsFd + Copy,
    len: usize,
) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        socket.ready(interest).await?;
        match socket.try_io(interest, || {
            splice(from, None, to, None, len, flags).map_err(io::Error::from)
        }) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

async fn splice_way(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    count: &AtomicU64,
    counters: &Counters,
) -> io::Result<()> {
    loop {
        // The pipe is empty here: fill it from the source socket...
        let n = splice_ready(from, Interest::READABLE, from, &pipe.write, PIPE_SIZE).await?;
        if n == 0 {
            // Pass the half-close on; the other direction keeps going.
            return shutdown_write(to);
        }
        // ...and drain all of it into the destination before reading more.
        let mut left = n;
        while left > 0 {
            let m = splice_ready(to, Interest::WRITABLE, &pipe.read, to, left).await?;
            if m == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            left -= m;
            counters.moved(count, m);
        }
    }
}

/// How a bounded copy ended.
enum Copied {
    /// The source closed and the end was passed on.
    Ended,
    /// The limit was reached with the stream still open.
    Limit,
}

/// Copies through `buf` (its capacity; reserved, not zero-filled, so that a quiet connection
/// touches no more than the pages data actually passes through) until `from` ends or, with
/// `limit`, until at least that many bytes moved.
async fn copy_way(
    from: &TcpStream,
    to: &TcpStream,
    count: &AtomicU64,
    counters: &Counters,
    buf: &mut Vec<u8>,
    limit: Option<usize>,
) -> io::Result<Copied> {
    let mut total = 0usize;
    loop {
        if limit.is_some_and(|l| total >= l) {
            return Ok(Copied::Limit);
        }
        from.readable().await?;
        buf.clear();
        let n = match from.try_read_buf(buf) {
            Ok(0) => {
                shutdown_write(to)?;
                return Ok(Copied::Ended);
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let mut sent = 0;
        while let Some(rest) = buf.get(sent..n).filter(|r| !r.is_empty()) {
            to.writable().await?;
            match to.try_write(rest) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(m) => {
                    sent += m;
                    counters.moved(count, m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        total += n;
    }
}

/// Bytes a direction copies through a small buffer before it moves to splice: a request
/// head or a small answer costs no pipe (two descriptors and four system calls).
const SPLICE_AFTER: usize = 64 * 1024;

/// Buffer of the first bytes of a direction.
const SMALL_BUF: usize = 16 * 1024;

async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    count: &AtomicU64,
    counters: &Counters,
    use_splice: bool,
) -> io::Result<()> {
    if !use_splice {
        let mut buf = Vec::with_capacity(BUF_SIZE);
        return copy_way(from, to, count, counters, &mut buf, None)
            .await
            .map(|_| ());
    }
    let mut small = Vec::with_capacity(SMALL_BUF);
    if let Copied::Ended =
        copy_way(from, to, count, counters, &mut small, Some(SPLICE_AFTER)).await?
    {
        return Ok(());
    }
    drop(small);
    match Pipe::new() {
        Ok(pipe) => splice_way(from, to, &pipe, count, counters).await,
        Err(e) => {
            tracing::debug!(error = %e, "no pipe for splice, relaying through a buffer");
            let mut buf = Vec::with_capacity(BUF_SIZE);
            copy_way(from, to, count, counters, &mut buf, None)
                .await
                .map(|_| ())
        }
    }
}

/// Relays between `client` and `upstream` until both sides are done, one fails, or nothing
/// moves for `idle`. `use_splice = false` copies through a buffer all the way.
pub(crate) async fn pump(
    client: &TcpStream,
    upstream: &TcpStream,
    idle: Duration,
    counters: &Counters,
    use_splice: bool,
) -> PumpEnd {
    counters.touch();
    let both = async {
        tokio::try_join!(
            one_way(client, upstream, &counters.up, counters, use_splice),
            one_way(upstream, client, &counters.down, counters, use_splice)
        )
    };
    let watchdog = async {
        let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        loop {
            tokio::time::sleep(tick).await;
            if counters.idle_for() >= idle {
                return;
            }
        }
    };
    tokio::select! {
        result = both => match result {
            Ok(_) => PumpEnd::Closed,
            Err(e) => PumpEnd::Failed(e),
        },
        () = watchdog => PumpEnd::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Both relay paths move every byte both ways, pass half-closes on and count bytes.
    #[tokio::test]
    async fn relays_both_ways_with_splice_and_with_the_copy_loop() {
        for use_splice in [true, false] {
            let (mut client, proxy_client) = pair().await;
            let (proxy_upstream, mut server) = pair().await;
            let counters = Counters::new();
            let relay = async {
                let (up, down) = if use_splice {
                    let (p1, p2) = (Pipe::new().unwrap(), Pipe::new().unwrap());
                    tokio::join!(
                        splice_way(&proxy_client, &proxy_upstream, &p1, &counters.up, &counters),
                        splice_way(
                            &proxy_upstream,
                            &proxy_client,
                            &p2,
                            &counters.down,
                            &counters
                        )
                    )
                } else {
                    let (mut b1, mut b2) = (Vec::with_capacity(1000), Vec::with_capacity(1000));
                    let (up, down) = tokio::join!(
                        copy_way(
                            &proxy_client,
                            &proxy_upstream,
                            &counters.up,
                            &counters,
                            &mut b1,
                            None
                        ),
                        copy_way(
                            &proxy_upstream,
                            &proxy_client,
                            &counters.down,
                            &counters,
                            &mut b2,
                            None
                        )
                    );
                    (up.map(|_| ()), down.map(|_| ()))
                };
                up.unwrap();
                down.unwrap();
            };
            let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
            let ends = async {
                let send = async {
                    client.write_all(&data).await.unwrap();
                    client.shutdown().await.unwrap();
                    let mut back = Vec::new();
                    client.read_to_end(&mut back).await.unwrap();
                    back
                };
                let serve = async {
                    let mut got = Vec::new();
                    server.read_to_end(&mut got).await.unwrap();
                    server.write_all(b"thanks").await.unwrap();
                    server.shutdown().await.unwrap();
                    got
                };
                tokio::join!(send, serve)
            };
            let ((), (back, got)) = tokio::join!(relay, ends);
            assert_eq!(got, data, "splice={use_splice}");
            assert_eq!(back, b"thanks");
            assert_eq!(counters.up.load(Ordering::Relaxed), data.len() as u64);
            assert_eq!(counters.down.load(Ordering::Relaxed), 6);
        }
    }
}
