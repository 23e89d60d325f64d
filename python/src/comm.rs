//! `Communicator`: one rank of a job, from Python.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use ringcc_comm::Options;
use ringcc_core::{Call, Collective, Rank, ReduceOp};

use crate::buffer::{dtype_named, Buf, DTYPE_NAMES};
use crate::error::{bad_buffer, to_py, Details};
use crate::store::PyStore;
use crate::work::{Keep, Work};

/// The store key under which rank 0 publishes a drawn job token.
const TOKEN_KEY: &str = "ringcc/token";

/// Seconds (a number or a `datetime.timedelta`) as a duration.
pub fn seconds(t: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let s: f64 = match t.call_method0("total_seconds") {
        Ok(v) => v.extract()?,
        Err(_) => t.extract()?,
    };
    Duration::try_from_secs_f64(s)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("a timeout of {s} s: {e}")))
}

/// The element types ringcc has, by name and size in bytes.
#[pyfunction]
pub fn dtypes() -> Vec<(&'static str, u8)> {
    DTYPE_NAMES.iter().map(|&(n, d)| (n, d.size())).collect()
}

fn op_named(py: Python<'_>, op: &str) -> PyResult<ReduceOp> {
    Ok(match op.to_ascii_lowercase().as_str() {
        "sum" => ReduceOp::Sum,
        "prod" | "product" => ReduceOp::Prod,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        "avg" | "mean" => ReduceOp::Avg,
        _ => {
            return Err(Details::new(
                "bad_config",
                format!("no reduction {op:?} (sum, prod, min, max, avg)"),
            )
            .into_py(py))
        }
    })
}

/// A job token nobody can guess: rank 0 draws it and publishes it in the
/// store; the others read it there.
fn token_through(store: &PyStore, rank: u32, timeout: Duration) -> ringcc_comm::Result<String> {
    use ringcc_comm::store::Store;
    use std::hash::{BuildHasher, Hasher};
    if rank == 0 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        let t = format!("py-{:016x}", h.finish());
        store.set(TOKEN_KEY, t.as_bytes())?;
        Ok(t)
    } else {
        Ok(String::from_utf8_lossy(&store.get(TOKEN_KEY, timeout)?).into_owned())
    }
}

/// One rank of a job. Collectives take buffer-protocol objects (numpy
/// arrays and the like; the `ringcc` package also takes torch tensors and
/// DLPack objects) and run in place when `out` is not given; they block
/// with the GIL released, or return a `Work` with `async_op=True`.
#[pyclass(module = "ringcc._ringcc")]
pub struct Communicator {
    inner: RwLock<Option<Arc<ringcc_comm::Communicator>>>,
    rank: u32,
    world: u32,
}

impl Communicator {
    fn wrap(c: ringcc_comm::Communicator) -> Communicator {
        Communicator {
            rank: c.rank().0,
            world: c.world_size(),
            inner: RwLock::new(Some(Arc::new(c))),
        }
    }

    fn get(&self, py: Python<'_>) -> PyResult<Arc<ringcc_comm::Communicator>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Details::new("closed", "the communicator is closed").into_py(py))
    }

    /// One collective: buffers checked, the call built, run blocking or
    /// queued.
    #[expect(
        clippy::too_many_arguments,
        reason = "the one entry of the five collectives: their arguments, resolved"
    )]
    fn collective(
        &self,
        py: Python<'_>,
        what: Collective,
        buf: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        op: ReduceOp,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        let comm = self.get(py)?;
        let dtype = dtype.map(|d| dtype_named(py, d)).transpose()?;
        let per_rank = matches!(what, Collective::ReduceScatter | Collective::AllGather);
        let world = self.world as usize;
        let (input, output) = match out {
            None => (None, Buf::get(buf, dtype, "in-place", true)?),
            Some(o) => {
                let i = Buf::get(buf, dtype, "input", false)?;
                let o = Buf::get(o, dtype, "output", true)?;
                if i.dtype != o.dtype {
                    return Err(bad_buffer(
                        py,
                        format!("input holds {:?}, output {:?}", i.dtype, o.dtype),
                    ));
                }
                if i.same_as(&o) && !per_rank {
                    (None, o)
                } else if i.overlaps(&o) {
                    return Err(bad_buffer(
                        py,
                        "input and output overlap (pass one buffer, without out=, to run in place)",
                    ));
                } else {
                    (Some(i), o)
                }
            }
        };
        let count = match (&input, what) {
            (Some(i), Collective::AllGather) => i.elements(),
            (None, Collective::ReduceScatter | Collective::AllGather) => {
                if output.elements() % world != 0 {
                    return Err(bad_buffer(
                        py,
                        format!(
                            "an in-place {} buffer holds {} blocks of the same size, one per rank; {} elements do not split in {world}",
                            if what == Collective::AllGather { "AllGather" } else { "ReduceScatter" },
                            world,
                            output.elements()
                        ),
                    ));
                }
                output.elements() / world
            }
            (_, _) => output.elements(),
        } as u64;
        let call = Call::new(what, count, output.dtype, op);
        if async_op {
            let work = match input {
                None => {
                    let (p, n) = (output.ptr(), output.len());
                    // SAFETY: `output`'s exporter keeps its memory alive and
                    // unmoved while the buffer is held, and the call holds it
                    // (in `Keep`) until it is done; Python code that writes
                    // it meanwhile breaks the documented contract of an
                    // asynchronous call, as with any framework's.
                    unsafe { comm.submit_raw_in_place(call, p, n, Keep(vec![output])) }
                }
                Some(i) => {
                    let (ip, il, op_, ol) = (i.ptr(), i.len(), output.ptr(), output.len());
                    // SAFETY: as above for both buffers, which were checked
                    // not to overlap.
                    unsafe { comm.submit_raw(call, ip, il, op_, ol, Keep(vec![i, output])) }
                }
            };
            return Ok(Some(Work::new(work)));
        }
        // SAFETY: the buffers are held (alive, unmoved) until this
        // returns, the output is writable, the input does not overlap it;
        // the slices live only for the blocking call.
        let out_bytes = unsafe { std::slice::from_raw_parts_mut(output.ptr(), output.len()) };
        let r = match &input {
            None => py.detach(|| comm.run_in_place(&call, out_bytes)),
            Some(i) => {
                // SAFETY: as above; the input is only read.
                let in_bytes = unsafe { std::slice::from_raw_parts(i.ptr().cast_const(), i.len()) };
                py.detach(|| comm.run(&call, in_bytes, out_bytes))
            }
        };
        r.map_err(|e| to_py(py, &e))?;
        Ok(None)
    }
}

fn root_of(py: Python<'_>, root: u32, world: u32) -> PyResult<Rank> {
    if root < world {
        Ok(Rank(root))
    } else {
        Err(Details::new("bad_config", format!("root {root} of {world} ranks")).into_py(py))
    }
}

#[pymethods]
impl Communicator {
    /// Joins the job as `rank` of `world_size`, bootstrapping over
    /// `store` (any object with torch `Store`'s `set`, `get`, `add`,
    /// `check` and `wait`; every rank's reaches the same keys; one store,
    /// or one prefix of it, per communicator). `token`: the job's shared
    /// secret (default: rank 0 draws one and publishes it in the store).
    /// `timeout` (seconds or `timedelta`): connecting and every call fail
    /// when nothing moves this long (default `RINGCC_TIMEOUT_MS`, else
    /// 30 s). `bind_toward` (`host:port`): TCP binds the address that
    /// routes there (`RINGCC_SOCKET_IFNAME` wins). Other settings come
    /// from the `RINGCC_*` environment.
    #[new]
    #[pyo3(signature = (rank, world_size, store, *, token=None, timeout=None, bind_toward=None))]
    fn new(
        py: Python<'_>,
        rank: u32,
        world_size: u32,
        store: Py<PyAny>,
        token: Option<String>,
        timeout: Option<Bound<'_, PyAny>>,
        bind_toward: Option<String>,
    ) -> PyResult<Communicator> {
        let mut options = Options::from_env().map_err(|e| to_py(py, &e))?;
        if let Some(t) = timeout.filter(|t| !t.is_none()) {
            options.timeout = seconds(&t)?;
        }
        let store = Arc::new(PyStore::new(store));
        let made = py.detach(move || -> ringcc_comm::Result<ringcc_comm::Communicator> {
            let toward = bind_toward
                .as_deref()
                .map(ringcc_comm::resolve)
                .transpose()?;
            let ip = ringcc_comm::net::bind_ip(toward)?;
            let token = match token {
                Some(t) => t,
                None => token_through(&store, rank, options.timeout)?,
            };
            let transports = ringcc_host::transports(ip, options.timeout);
            ringcc_comm::Communicator::new(
                Rank(rank),
                world_size,
                store,
                &token,
                options,
                transports,
            )
        });
        made.map(Communicator::wrap).map_err(|e| to_py(py, &e))
    }

    /// The communicator of this process from the launcher's environment
    /// (torchrun's `RANK` / `WORLD_SIZE` / `MASTER_ADDR` / `MASTER_PORT`,
    /// mpirun, srun or `RINGCC_*`); rank 0 serves ringcc's own store.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Communicator> {
        py.detach(ringcc_host::communicator_from_env)
            .map(Communicator::wrap)
            .map_err(|e| to_py(py, &e))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world
    }

    /// Per channel, the transports of the outgoing and incoming hops.
    #[getter]
    fn hops(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, &'static str)>> {
        Ok(self.get(py)?.hops().to_vec())
    }

    /// The settings in use, as a dict (channels, timeout in seconds, …).
    #[getter]
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.get(py)?;
        let o = c.options();
        let d = PyDict::new(py);
        d.set_item("channels", o.channels)?;
        d.set_item("timeout", o.timeout.as_secs_f64())?;
        d.set_item("chunk_bytes", o.chunk_bytes)?;
        d.set_item("channel_bytes", c.channel_bytes())?;
        d.set_item("node", &o.node)?;
        Ok(d)
    }

    /// Calls completed so far.
    #[getter]
    fn calls(&self, py: Python<'_>) -> PyResult<u64> {
        let c = self.get(py)?;
        Ok(py.detach(|| c.calls()))
    }

    /// AllReduce: every rank ends with the reduction (`op`: sum, prod,
    /// min, max, avg) of every rank's `buf` — in `buf`, or in `out`.
    #[pyo3(signature = (buf, op="sum", *, out=None, async_op=false, dtype=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        let op = op_named(py, op)?;
        self.collective(py, Collective::AllReduce, buf, out, op, async_op, dtype)
    }

    /// ReduceScatter: `buf` holds `world_size` equal blocks; rank `r` ends
    /// with block `r` of the reduction — in `out` (one block), or in
    /// place in its block of `buf`.
    #[pyo3(signature = (buf, op="sum", *, out=None, async_op=false, dtype=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        let op = op_named(py, op)?;
        self.collective(py, Collective::ReduceScatter, buf, out, op, async_op, dtype)
    }

    /// AllGather: block `r` of the result is rank `r`'s input — `buf`
    /// into `out` (`world_size` blocks), or in place (`buf` holds every
    /// block; this rank's input is block `rank`).
    #[pyo3(signature = (buf, *, out=None, async_op=false, dtype=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        self.collective(
            py,
            Collective::AllGather,
            buf,
            out,
            ReduceOp::Sum,
            async_op,
            dtype,
        )
    }

    /// Broadcast: every rank ends with `root`'s `buf` — in `buf`, or in
    /// `out` (other ranks' `buf` is not read).
    #[pyo3(signature = (buf, root, *, out=None, async_op=false, dtype=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: u32,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        let root = root_of(py, root, self.world)?;
        self.collective(
            py,
            Collective::Broadcast { root },
            buf,
            out,
            ReduceOp::Sum,
            async_op,
            dtype,
        )
    }

    /// Reduce: `root` ends with the reduction of every rank's `buf` — in
    /// `buf`, or in `out` (other ranks' results are left as they are).
    #[pyo3(signature = (buf, root, op="sum", *, out=None, async_op=false, dtype=None))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the keyword arguments of the Python method"
    )]
    fn reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: u32,
        op: &str,
        out: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&str>,
    ) -> PyResult<Option<Work>> {
        let root = root_of(py, root, self.world)?;
        let op = op_named(py, op)?;
        self.collective(
            py,
            Collective::Reduce { root },
            buf,
            out,
            op,
            async_op,
            dtype,
        )
    }

    /// Waits until every rank has reached this point.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.get(py)?;
        py.detach(|| c.barrier()).map_err(|e| to_py(py, &e))
    }

    /// Splits the ranks by `color` (`None`: join none, get `None`); the
    /// ranks of one color form a new communicator, ranked by
    /// `(key, rank)`. Every rank must call it.
    #[pyo3(signature = (color, key=0))]
    fn split(
        &self,
        py: Python<'_>,
        color: Option<u32>,
        key: u32,
    ) -> PyResult<Option<Communicator>> {
        let c = self.get(py)?;
        py.detach(|| c.split(color, key))
            .map(|o| o.map(Communicator::wrap))
            .map_err(|e| to_py(py, &e))
    }

    /// Aborts the job: every rank's current and later calls fail with
    /// `ringcc.Aborted` naming this rank and `reason`. Returns at once.
    #[pyo3(signature = (reason="aborted from Python"))]
    fn abort(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let c = self.get(py)?;
        py.detach(|| c.abort(reason));
        Ok(())
    }

    /// Finishes the queued calls and closes every connection; raises the
    /// first failure of a call nobody waited for. Later calls raise
    /// `ringcc.Error` (kind `closed`). Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.write().unwrap_or_else(|p| p.into_inner()).take();
        let Some(c) = taken else {
            return Ok(());
        };
        // A call still running in another thread holds the communicator:
        // it closes when that call returns.
        py.detach(|| match Arc::try_unwrap(c) {
            Ok(c) => c.close(),
            Err(shared) => {
                drop(shared);
                Ok(())
            }
        })
        .map_err(|e| to_py(py, &e))
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn __repr__(&self) -> String {
        format!("<ringcc.Communicator rank {} of {}>", self.rank, self.world)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let taken = self
            .inner
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(c) = taken {
            // Closing joins the communicator's threads, and its watcher
            // may be waiting to attach (the store): close detached. When
            // the interpreter is gone, `c` is dropped with the closure.
            let _ = Python::try_attach(move |py| py.detach(move || drop(c)));
        }
    }
}
