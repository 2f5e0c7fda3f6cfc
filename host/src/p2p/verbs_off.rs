//! Without the `verbs` feature there is no RDMA transport: these types
//! have no values, so the code that would use one is never reached.

use super::link::{ConnInner, MrInner, Op};
use crate::error::Result;
use crate::runtime::Device;
use std::sync::Arc;
use std::time::Duration;

/// An endpoint's RDMA device (none without the `verbs` feature).
pub(crate) enum Rdma {}

/// A queue pair not connected yet (none).
pub(crate) enum QpSetup {}

/// A connection's queue pair (none).
pub(crate) enum RcConn {}

/// What a transfer's last request finishes (read by the verbs transport only).
#[allow(dead_code)]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// A send into the peer's receive `seq`.
    Send(u64),
    /// A one-sided write.
    Write,
    /// A one-sided read.
    Read,
}

impl Rdma {
    pub(crate) unsafe fn reg(&self, _: &Device, _: u64, _: usize, _: bool) -> Result<(u32, u32)> {
        match *self {}
    }
    pub(crate) fn dereg(&self, _: (u32, u32)) {
        match *self {}
    }
    pub(crate) fn new_qp(self: &Arc<Self>) -> Result<QpSetup> {
        match **self {}
    }
}

impl QpSetup {
    pub(crate) fn record(&self) -> [u8; 48] {
        match *self {}
    }
    pub(crate) fn connect(self, _: &[u8]) -> Result<Arc<RcConn>> {
        match self {}
    }
}

impl RcConn {
    pub(crate) fn attach(&self, _: &Arc<ConnInner>) {
        match *self {}
    }
    pub(crate) fn device(&self) -> String {
        match *self {}
    }
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn transfer(
        &self,
        _: &Arc<Op>,
        _: &Arc<MrInner>,
        _: u64,
        _: usize,
        _: u64,
        _: u32,
        _: Kind,
        _: Duration,
    ) -> Result<()> {
        match *self {}
    }
    pub(crate) fn shut(&self, _: &crate::error::Error) {
        match *self {}
    }
}
