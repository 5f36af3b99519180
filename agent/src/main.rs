//! edgevx: an eBPF VXLAN dataplane that stands in for flanneld's vxlan
//! backend, node by node, and keeps its VTEP MAC across reboots.

use std::process::ExitCode;

use clap::Parser;
use edgevx::{UsageError, bugtool, cleanup, cli, cli_flanneld, monitor, run, status};

fn raise_memlock() {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid struct; failure only matters on old kernels.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("cannot raise RLIMIT_MEMLOCK (fine on kernels with memcg accounting)");
    }
}

/// The soft open-files limit up to the hard one. containerd 2 starts
/// containers at 1,024 soft: a burst of connections to the metrics port,
/// or a large cluster's sockets, must not leave the agent without
/// descriptors for its own state files and BPF objects.
fn raise_nofile() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a valid struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur >= limit.rlim_max {
        return;
    }
    let was = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        tracing::info!(was, now = limit.rlim_max, "raised the soft open-files limit to the hard one");
    } else {
        tracing::warn!(was, hard = limit.rlim_max, "cannot raise the soft open-files limit");
    }
}

fn main() -> ExitCode {
    edgevx::metrics::startup::process_started();
    // flanneld's flags and FLANNELD_* variables, as a flanneld unit passes them
    let args = match cli_flanneld::translate(std::env::args_os().collect(), &|k| std::env::var(k).ok()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("edgevx: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = cli::Cli::parse_from(args);
    // EDGEVX_LOG, else flanneld's -v=N, else info
    let verbosity = match &cli.command {
        cli::Command::Run(a) => a.log_filter(),
        _ => None,
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDGEVX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(verbosity.unwrap_or("info"))),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        cli::LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        // one JSON object per line, the event's fields flattened beside `message`
        cli::LogFormat::Json => logs.json().flatten_event(true).with_ansi(false).init(),
    }
    raise_memlock();
    raise_nofile();
    // one TLS provider for kube (rustls) and etcd (tonic): ring
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("edgevx: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Run(args) => {
                if args.strict_inner_source {
                    tracing::warn!(
                        "--strict-inner-source is deprecated and has no effect: inner sources are always bound to \
                         the sending peer's pod CIDR (exempt a peer with --any-inner-source)"
                    );
                }
                run::run(*args).await
            }
            cli::Command::Status(args) => status::run(args),
            cli::Command::Monitor(args) => monitor::run(args).await,
            cli::Command::Bugtool(args) => bugtool::run(args),
            cli::Command::Cleanup(args) => cleanup::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<edgevx::SilentExit>().is_some() => {
            ExitCode::from(e.downcast_ref::<edgevx::SilentExit>().map_or(1, |s| s.0))
        }
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            eprintln!("edgevx: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("edgevx: {e:#}");
            ExitCode::FAILURE
        }
    }
}
