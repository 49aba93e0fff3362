//! [`ContextGuard`]: make a ring's context current for a scope, then give the
//! caller back whatever was current before (nothing, or a foreign context).

use std::marker::PhantomData;

use super::driver::{CuContext, DResult, Driver};

/// Makes `ctx` current on this thread until [`restore`](Self::restore) or
/// drop, then makes the caller's previous context current again.
///
/// When `ctx` is already current nothing is pushed or popped. Context stacks
/// are per thread, so the guard is neither `Send` nor `Sync`.
#[must_use = "the context is popped when the guard is dropped"]
pub struct ContextGuard<'d, D: Driver> {
    driver: &'d D,
    ctx: CuContext,
    pushed: bool,
    _per_thread: PhantomData<*const ()>,
}

impl<'d, D: Driver> ContextGuard<'d, D> {
    /// Pushes `ctx` unless it is already current.
    ///
    /// # Safety
    /// `ctx` is a live context of `driver` (it is retained by the caller for
    /// the guard's lifetime).
    ///
    /// # Errors
    /// The driver's error from `cuCtxGetCurrent` or `cuCtxPushCurrent`;
    /// nothing was pushed then.
    pub unsafe fn push(driver: &'d D, ctx: CuContext) -> DResult<Self> {
        let current = driver.ctx_get_current()?;
        let pushed = current != Some(ctx);
        if pushed {
            // SAFETY: `ctx` is live (this function's contract).
            unsafe { driver.ctx_push_current(ctx) }?;
        }
        Ok(ContextGuard {
            driver,
            ctx,
            pushed,
            _per_thread: PhantomData,
        })
    }

    /// The context this guard made current.
    pub fn context(&self) -> CuContext {
        self.ctx
    }

    /// Pops the context now, so the caller's previous context is current
    /// again, and reports a failure.
    ///
    /// A failed pop is retried once before it is reported: a thread left with
    /// the ring's context current would run the caller's later work in the
    /// wrong context, which is worse than one more driver call.
    ///
    /// # Errors
    /// The driver's error from `cuCtxPopCurrent` after the retry.
    pub fn restore(mut self) -> DResult<()> {
        self.pop()
    }

    fn pop(&mut self) -> DResult<()> {
        if !self.pushed {
            return Ok(());
        }
        let popped = match self.driver.ctx_pop_current() {
            Ok(p) => p,
            Err(first) => {
                tracing::debug!(error = %first, "cuCtxPopCurrent failed; retrying once");
                self.driver.ctx_pop_current()?
            }
        };
        self.pushed = false;
        if popped != Some(self.ctx) {
            tracing::warn!(
                expected = self.ctx.to_bits(),
                popped = ?popped.map(CuContext::to_bits),
                "popped a context other than the one pushed: the scope pushed without popping"
            );
        }
        Ok(())
    }
}

impl<D: Driver> Drop for ContextGuard<'_, D> {
    fn drop(&mut self) {
        if let Err(e) = self.pop() {
            tracing::warn!(error = %e, "could not restore the caller's CUDA context");
        }
    }
}

/// Runs `f` with `ctx` current, restoring the caller's context afterwards.
/// The first error wins: `f`'s, then the restore's.
///
/// # Safety
/// `ctx` is a live context of `driver`.
pub unsafe fn with_context<D: Driver, T>(
    driver: &D,
    ctx: CuContext,
    f: impl FnOnce(&D) -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    // SAFETY: `ctx` is live (this function's contract).
    let guard = unsafe { ContextGuard::push(driver, ctx) }?;
    let r = f(driver);
    let restored = guard.restore();
    let v = r?;
    restored?;
    Ok(v)
}
