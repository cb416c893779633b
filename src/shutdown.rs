//! The process's stop signal: Ctrl-C or SIGTERM.

/// Completes on the first Ctrl-C (SIGINT) or SIGTERM.
pub async fn signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// [`signal`] as a watch that turns true, for loops that poll it.
pub fn watch() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signal().await;
        let _ = tx.send(true);
    });
    rx
}
