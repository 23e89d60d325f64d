//! An opened RDMA device: context, port, GID, protection domain.

use std::sync::Arc;

use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::ib::mem::Leases;

/// `IBV_PORT_ACTIVE`.
const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;

/// One opened device port with its addressing and protection domain.
pub(crate) struct Nic {
    pub name: String,
    pub port: u8,
    pub gid: Gid,
    pub gid_index: u8,
    pub lid: u16,
    /// `enum ibv_mtu` of the port (1 = 256 B … 5 = 4096 B).
    pub active_mtu: u32,
    pub ctx: Arc<DeviceContext>,
    pub pd: Arc<ProtectionDomain>,
    /// Whether the device registers dma-buf memory (GPUDirect RDMA of
    /// device memory), and if not, why (see [`dma_buf_support`]).
    pub dma_buf: std::result::Result<(), String>,
    /// Call buffers registered for the sending ends on this device.
    pub leases: Arc<Leases>,
}

/// The names of the RDMA devices present, sorted.
pub(crate) fn device_names() -> Result<Vec<String>> {
    let list = DeviceList::new().map_err(|e| Error::NoDevice {
        wanted: "any".into(),
        reason: format!("cannot list RDMA devices (is rdma-core installed?): {e}"),
    })?;
    let mut names: Vec<String> = list.iter().map(|d| d.name()).collect();
    names.sort();
    Ok(names)
}

impl Nic {
    /// Opens device `name` on `port`, choosing the GID as
    /// [`Config::gid_index`](crate::Config::gid_index) says.
    pub fn open(name: &str, port: u8, gid_index: Option<u32>) -> Result<Nic> {
        let list = DeviceList::new().map_err(|e| Error::NoDevice {
            wanted: name.into(),
            reason: format!("cannot list RDMA devices (is rdma-core installed?): {e}"),
        })?;
        let dev = list
            .iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::NoDevice {
                wanted: name.into(),
                reason: "no such device".into(),
            })?;
        let ctx = dev.open().map_err(Error::verbs("ibv_open_device", name))?;
        let port_attr = ctx
            .query_port(port)
            .map_err(Error::verbs("ibv_query_port", name))?;
        let attr = &port_attr.attr;
        if attr.state != PORT_ACTIVE {
            return Err(Error::NoDevice {
                wanted: format!("{name} port {port}"),
                reason: format!("port state {} is not ACTIVE", attr.state),
            });
        }
        let (gid_index, gid) = match gid_index {
            Some(i) => {
                let gid = ctx
                    .query_gid(port, i)
                    .map_err(Error::verbs("ibv_query_gid", name))?;
                (i, gid)
            }
            None => pick_gid(&ctx, port, attr.gid_tbl_len, attr.link_layer, name)?,
        };
        let gid_index = u8::try_from(gid_index).map_err(|_| Error::NoDevice {
            wanted: name.into(),
            reason: format!("GID index {gid_index} does not fit the address vector"),
        })?;
        let pd = ctx.alloc_pd().map_err(Error::verbs("ibv_alloc_pd", name))?;
        info!(
            device = name,
            port,
            gid_index,
            %gid,
            mtu = 128u32 << attr.active_mtu,
            "verbs: device open"
        );
        let dma_buf = dma_buf_support(&pd);
        debug!(device = name, dma_buf = ?dma_buf, "verbs: dma-buf registration");
        Ok(Nic {
            leases: Arc::new(Leases::new(&pd, name)),
            dma_buf,
            name: name.to_owned(),
            port,
            gid,
            gid_index,
            lid: attr.lid,
            active_mtu: attr.active_mtu,
            ctx,
            pd,
        })
    }
}

/// Whether `pd`'s device registers dma-buf memory (`ibv_reg_dmabuf_mr`),
/// asked as NCCL asks it: a registration of nothing from descriptor -1
/// fails either way, with `EOPNOTSUPP` or `EPROTONOSUPPORT` where the
/// library, the provider or the kernel lacks dma-buf support (Soft-RoCE
/// among them), and with another error (a bad descriptor) where it has
/// it.
pub(crate) fn dma_buf_support(pd: &Arc<ProtectionDomain>) -> std::result::Result<(), String> {
    use sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind as Kind;
    // SAFETY: a registration of zero bytes from no descriptor: the
    // library or the kernel refuses it before any memory is touched
    // (NCCL's `ncclIbDmaBufSupport` asks the same way).
    let probe = unsafe { pd.reg_dmabuf_mr(0, 0, 0, -1, sideway::ibverbs::AccessFlags::LocalWrite) };
    let errno = match probe {
        // Nothing registered can come of it; were it to, it is dropped.
        Ok(_) => return Ok(()),
        Err(e) => match e.0 {
            Kind::Ibverbs(io) => io.raw_os_error(),
            _ => None,
        },
    };
    match errno {
        // ENOSYS: a libibverbs without the call.
        Some(code @ (libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS)) => Err(format!(
            "the device cannot register dma-buf memory (ibv_reg_dmabuf_mr: {})",
            std::io::Error::from_raw_os_error(code)
        )),
        _ => Ok(()),
    }
}

/// RoCEv2 with an IPv4-mapped address, else any RoCEv2 that is not link
/// local, else (InfiniBand) index 0.
fn pick_gid(
    ctx: &Arc<DeviceContext>,
    port: u8,
    table_len: i32,
    link_layer: u8,
    name: &str,
) -> Result<(u32, Gid)> {
    let mut v2_any: Option<(u32, Gid)> = None;
    let mut first: Option<(u32, Gid)> = None;
    for i in 0..u32::try_from(table_len).unwrap_or(0) {
        let Ok(entry) = ctx.query_gid_ex(port, i) else {
            continue;
        };
        let gid = entry.gid();
        if gid.is_zero() {
            continue;
        }
        debug!(device = name, index = i, %gid, "verbs: GID");
        first.get_or_insert((i, gid));
        if entry.gid_type() == GidType::RoceV2 {
            let raw = gid.raw;
            let v4_mapped = raw[..10].iter().all(|&b| b == 0) && raw[10] == 0xff && raw[11] == 0xff;
            if v4_mapped {
                return Ok((i, gid));
            }
            if !gid.is_unicast_link_local() {
                v2_any.get_or_insert((i, gid));
            }
        }
    }
    if let Some(g) = v2_any {
        return Ok(g);
    }
    if link_layer != LINK_LAYER_ETHERNET {
        if let Some(g) = first {
            return Ok(g);
        }
    }
    Err(Error::NoDevice {
        wanted: format!("{name} port {port}"),
        reason: "no usable GID (RoCE needs an IP address on the netdev; set RINGCC_IB_GID_INDEX)"
            .into(),
    })
}
