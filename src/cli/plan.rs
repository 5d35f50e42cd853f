//! `copyrator plan`: what `run` would do now, written to standard output
//! and said by the exit code, for the rules of files or for every live
//! rule. The views are filled as `run` fills them and each rule waits for
//! its sources; nothing is written (the writer's gate is shut, and previews
//! write nothing anyway). With `--member-clusters` the plan covers each
//! member of the inventory too (`cli::plan_members`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::api::kinds::Kind;
use crate::api::rule::CopyratorRule;
use crate::cli::plan_members::PlanMembers;
use crate::cli::report::{self, ClusterVerdict, FileRule, Followed, PlanError, Report};
use crate::cli::settings::{PlanArgs, PlanOutput, Settings};
use crate::cluster::leader::LeaderGate;
use crate::controller::finalizer::orphans;
use crate::controller::reconcile::preview;
use crate::controller::state::{Options, Shared};
use crate::core::plan::Action;
use crate::core::preview::{PlannedChange, Preview};
use crate::ops::http::Health;
use crate::ops::metrics::Metrics;
use crate::sync::read;

/// How long `plan` waits for the API server to answer at all.
const PLAN_REACH_WITHIN: Duration = Duration::from_secs(10);
/// How long `plan` waits for its caches, and then for the rules' sources.
const PLAN_LISTS_WITHIN: Duration = Duration::from_secs(30);

/// `copyrator plan`: the files first (a broken file needs no cluster), then
/// the report on standard output, refused rules and errors on standard
/// error, and the exit code.
pub(crate) fn plan_command(settings: Settings, args: PlanArgs) -> ExitCode {
    let failed = ExitCode::from(report::EXIT_FAILED);
    let from_files = if args.files.is_empty() {
        None
    } else {
        match read_rule_files(&args.files, &settings) {
            Ok(rules) => Some(rules),
            Err(e) => {
                eprintln!("error: {e}");
                return failed;
            }
        }
    };
    let builder = tokio::runtime::Builder::new_multi_thread();
    let runtime = match crate::cli::start_runtime(builder, failed) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let report = match runtime.block_on(plan(settings, from_files)) {
        Ok(report) => report.sorted(),
        Err(e) => {
            eprintln!("error: {e:#}");
            return failed;
        }
    };
    let printed = match args.output {
        PlanOutput::Text => Ok(report.text()),
        PlanOutput::Json => report.json(),
    };
    let written = printed.map_err(anyhow::Error::from).and_then(|text| {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .context("writing the plan to standard output")
    });
    if let Err(e) = written {
        eprintln!("error: {e:#}");
        return failed;
    }
    for refusal in report.refusals() {
        eprintln!("error: {refusal}");
    }
    ExitCode::from(report.exit_code())
}

/// The rules of the `-f` files (`-` is standard input), each given once
/// and each one the operator would follow.
fn read_rule_files(files: &[PathBuf], settings: &Settings) -> Result<Vec<FileRule>, PlanError> {
    let mut parsed = Vec::with_capacity(files.len());
    for path in files {
        let (file, text) = if path.as_os_str() == "-" {
            let file = "standard input".to_owned();
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| PlanError::Read {
                    file: file.clone(),
                    source,
                })?;
            (file, text)
        } else {
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
                file: file.clone(),
                source,
            })?;
            (file, text)
        };
        parsed.push(report::parse_rules(&file, &text, &settings.namespace)?);
    }
    let rules = report::gather(parsed)?;
    let followed = Followed {
        operator_namespace: &settings.namespace,
        all_namespaces: settings.all_namespaces,
        rule_name: settings.rule_name.as_deref(),
    };
    for rule in &rules {
        followed.check(rule)?;
    }
    Ok(rules)
}

/// What `run` would do now for the rules of the files, each in place of
/// the live rule of its name, or without files for every live rule (and
/// the copies of rules that are gone): the views are filled as `run` fills
/// them, each rule waits for its sources, and nothing is written (the
/// gate is shut, and previews write nothing anyway).
async fn plan(settings: Settings, from_files: Option<Vec<FileRule>>) -> anyhow::Result<Report> {
    crate::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients =
        crate::cli::run::api_clients(settings.api_transport, settings.write_concurrency as usize)
            .await?;
    // One request first, so that an API server out of reach is said at once.
    let reader = crate::cluster::reader::Reader::new(clients.read.clone());
    tokio::time::timeout(PLAN_REACH_WITHIN, reader.version())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the Kubernetes API server did not answer within {} s",
                PLAN_REACH_WITHIN.as_secs()
            )
        })?
        .context("cannot reach the Kubernetes API server")?;
    let (gate, shut) = LeaderGate::always();
    let _ = shut.send(false);
    let options = Options {
        keep_kind_watches: true,
        ..settings.load_options()?
    };
    let shared = Shared::new(
        clients,
        settings.trust(),
        options,
        Arc::new(Metrics::default()),
        gate,
        Arc::new(Health::new(settings.stuck_after())),
    );
    let tasks = crate::cli::run::spawn_watches(&shared);
    let planned = plan_with_views(&shared, from_files).await;
    for task in tasks {
        task.abort();
    }
    planned
}

async fn plan_with_views(
    shared: &Arc<Shared>,
    from_files: Option<Vec<FileRule>>,
) -> anyhow::Result<Report> {
    // A plan on half-listed caches would miss copies and prune nothing.
    if tokio::time::timeout(
        PLAN_LISTS_WITHIN,
        shared.home.cluster.views.synced.wait_all(),
    )
    .await
    .is_err()
    {
        return Err(PlanError::CachesNotListed {
            missing: shared.home.cluster.views.synced.missing().join(", "),
            seconds: PLAN_LISTS_WITHIN.as_secs(),
        }
        .into());
    }
    let mut members = if shared.options.member_clusters {
        Some(PlanMembers::start(shared, PLAN_REACH_WITHIN, PLAN_LISTS_WITHIN).await?)
    } else {
        None
    };
    let every_live_rule = from_files.is_none();
    let live = read(&shared.rules).clone();
    let pending = report::rules_to_plan(from_files, &live);
    let mut report = Report::new(&shared.options.cluster_name);
    preview_rules(shared, pending, members.as_mut(), &mut report).await?;
    if every_live_rule {
        // `run` deletes these at start (in a member, once it answers).
        for kind in Kind::all() {
            for action in orphans(shared, kind) {
                if let Action::Delete { current, .. } = &action {
                    let rule = current.rule_ref.as_deref().unwrap_or_default();
                    let home = &shared.options.cluster_name;
                    report
                        .changes
                        .push(PlannedChange::of(home, rule, kind, &action));
                }
            }
            if let Some(members) = &members {
                report.changes.extend(members.orphans(shared, kind));
            }
        }
    }
    if let Some(members) = &members {
        members.keep_planned(&mut report.changes, &mut report.skipped);
        report.clusters = members.verdicts();
        report
            .clusters
            .push(ClusterVerdict::planned(&shared.options.cluster_name));
    }
    Ok(report)
}

/// Each rule's preview at home and in each member planned. Every rule
/// registers its sources in the first round, so that their watches list
/// together; later rounds ask only the rules still waiting.
async fn preview_rules(
    shared: &Arc<Shared>,
    mut pending: Vec<CopyratorRule>,
    mut members: Option<&mut PlanMembers>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + PLAN_LISTS_WITHIN;
    while !pending.is_empty() {
        let mut waiting = Vec::new();
        for rule in pending {
            let preview = match (preview(shared, &rule).await?, members.as_deref_mut()) {
                (Preview::Planned { changes, skipped }, Some(members)) => {
                    members.preview(shared, &rule, changes, skipped).await
                }
                (preview, _) => preview,
            };
            match preview {
                Preview::WaitingForSources => waiting.push(rule),
                preview => report.add(&rule.key(), preview),
            }
        }
        if !waiting.is_empty() {
            if tokio::time::Instant::now() >= deadline {
                let rules: Vec<String> = waiting.iter().map(|r| r.key().to_string()).collect();
                return Err(PlanError::SourcesNotListed {
                    rules: rules.join(", "),
                    seconds: PLAN_LISTS_WITHIN.as_secs(),
                }
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pending = waiting;
    }
    Ok(())
}
