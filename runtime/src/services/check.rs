//! `crust.admin.v1.Orphans`: `crust check` through the running daemon.
//! Reporting is for anyone who may reach the socket; repairing (removing
//! files, killing processes) for root only, by the caller's SO_PEERCRED
//! credentials.

use crust_api::admin::v1::orphans_server::Orphans;
use crust_api::admin::v1::{CheckRequest, CheckResponse, Orphan};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use super::admin::Admin;
use crate::check::{self, CheckError, Report};

#[tonic::async_trait]
impl Orphans for Admin {
    async fn check(&self, req: Request<CheckRequest>) -> Result<Response<CheckResponse>, Status> {
        let repair = req.get_ref().repair;
        if repair {
            let uid = req
                .extensions()
                .get::<UdsConnectInfo>()
                .and_then(|i| i.peer_cred)
                .map(|c| c.uid());
            if uid != Some(0) {
                let who = uid.map_or("unknown".to_string(), |u| format!("uid {u}"));
                return Err(Status::permission_denied(format!(
                    "repair is for root only (the caller is {who}); without it, crust check only reports"
                )));
            }
        }
        let report = check::online(&self.daemon, repair)
            .await
            .map_err(|e| match e {
                CheckError::DaemonRunning(_) | CheckError::NoState(_) => {
                    Status::failed_precondition(e.to_string())
                }
                other => Status::internal(format!("crust check: {other}")),
            })?;
        Ok(Response::new(response(&report)))
    }
}

/// A report as the admin API carries it (the CLI prints this, whether the
/// daemon or the CLI itself made the report).
pub fn response(report: &Report) -> CheckResponse {
    CheckResponse {
        orphans: report
            .orphans
            .iter()
            .map(|o| Orphan {
                kind: o.kind.as_str().to_string(),
                id: o.id.clone(),
                paths: o.paths.iter().map(|p| p.display().to_string()).collect(),
                bytes: o.bytes,
                detail: o.detail.clone(),
                repaired: matches!(o.outcome, Some(Ok(()))),
                repair_error: match &o.outcome {
                    Some(Err(why)) => why.clone(),
                    _ => String::new(),
                },
            })
            .collect(),
        repair: report.repair,
        root: report.root.display().to_string(),
        run_dir: report.run_dir.display().to_string(),
    }
}
