//! `copyrator release`: let go of every rule before the operator goes, so
//! that nothing it leaves behind holds a namespace. Run by the chart's
//! pre-delete hook: it stops the operator's Deployment (a running operator
//! would put its finalizers back), deletes the copies when asked to (here
//! and in every member cluster), then removes each rule's finalizer. Copies
//! handed over to their namespaces always stay.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use tokio::time::Instant;
use tracing::info;

use crate::api::kinds::{Discovered, Kind};
use crate::api::rule::CopyratorRule;
use crate::cache::index::Object;
use crate::cli::settings::{CopiesOnRelease, ReleaseArgs, Settings};
use crate::cli::whereabouts::member_clients;
use crate::cluster::reader::Reader;
use crate::cluster::tool_writes::ToolWrites;
use crate::{FINALIZER, LABEL_RULE_UID};

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(500);

pub(crate) fn release_command(settings: Settings, args: ReleaseArgs) -> ExitCode {
    let builder = tokio::runtime::Builder::new_multi_thread();
    let runtime = match crate::cli::start_runtime(builder, ExitCode::FAILURE) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(release(settings, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn release(settings: Settings, args: ReleaseArgs) -> anyhow::Result<()> {
    crate::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = crate::cli::run::api_clients(settings.api_transport, 1).await?;
    let client = clients.write.clone();
    let wait = Duration::from_secs(args.wait_seconds);
    if let Some(deployment) = &args.stop_deployment {
        stop_deployment(&client, &settings.namespace, deployment, wait).await?;
    }
    let rules = rules_in_scope(&client, &settings).await?;
    let uids: BTreeSet<String> = rules
        .iter()
        .filter_map(|r| r.uid().map(str::to_owned))
        .collect();
    let mut failed: Vec<String> = Vec::new();
    if args.copies == CopiesOnRelease::Delete {
        let kinds = kinds_of(&client, &rules).await?;
        let deleted = delete_copies(&client, &kinds, &uids).await?;
        info!(cluster = %settings.cluster_name, deleted, "deleted the copies of the rules");
        println!("{}: deleted {deleted} copies", settings.cluster_name);
        if settings.member_clusters {
            // A member that cannot be cleared keeps its copies; the rules
            // are released all the same (nothing else would let them go).
            match member_clients(clients.clone(), &settings).await {
                Ok(members) => {
                    for (member, reached) in members {
                        let cleared = match reached {
                            Ok((member_client, _)) => {
                                delete_copies(&member_client, &kinds, &uids).await
                            }
                            Err(why) => Err(anyhow::Error::msg(why)),
                        };
                        match cleared {
                            Ok(deleted) => {
                                info!(cluster = %member, deleted, "deleted the copies of the rules");
                                println!("{member}: deleted {deleted} copies");
                            }
                            Err(e) => {
                                eprintln!("error: member cluster {member}: its copies stay: {e:#}");
                                failed.push(member);
                            }
                        }
                    }
                }
                Err(e) => {
                    eprintln!("error: the member clusters: their copies stay: {e:#}");
                    failed.push("the inventory".to_owned());
                }
            }
        }
    }
    let mut released = 0;
    for rule in &rules {
        if remove_finalizer(&client, rule).await? {
            released += 1;
        }
    }
    info!(rules = rules.len(), released, "released the rules");
    println!(
        "released {released} of {} rules (their finalizers removed)",
        rules.len()
    );
    if !failed.is_empty() {
        bail!(
            "the copies stay in {}: they could not be deleted",
            failed.join(", ")
        );
    }
    Ok(())
}

/// Scale the operator's Deployment to nothing and wait until none of its
/// Pods is left: a running operator would put the finalizers back.
async fn stop_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Duration,
) -> anyhow::Result<()> {
    let scaled = ToolWrites::new(client.clone())
        .scale_to_zero(namespace, name)
        .await
        .with_context(|| format!("scaling Deployment {namespace}/{name} to 0"))?;
    let spec: k8s_openapi::api::apps::v1::DeploymentSpec = crate::api::required(scaled.spec);
    let selector = spec
        .selector
        .match_labels
        .filter(|labels| !labels.is_empty())
        .with_context(|| format!("Deployment {namespace}/{name} has no matchLabels"))?
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = Reader::new(client.clone()).within::<Pod>(namespace);
    let started = Instant::now();
    loop {
        let left = pods
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing the Pods of Deployment {namespace}/{name}"))?
            .items
            .len();
        if left == 0 {
            break;
        }
        if started.elapsed() > wait {
            bail!(
                "{left} Pods of Deployment {namespace}/{name} still run after {} s",
                wait.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let took = started.elapsed().as_secs_f64();
    info!(deployment = %format!("{namespace}/{name}"), took_s = took, "the operator is stopped");
    println!("stopped Deployment {namespace}/{name} in {took:.1} s");
    Ok(())
}

/// The rules this operator follows: in its namespace (or every namespace
/// with `--all-namespaces`), of `--rule-name` when set.
async fn rules_in_scope(
    client: &Client,
    settings: &Settings,
) -> anyhow::Result<Vec<CopyratorRule>> {
    let namespace = (!settings.all_namespaces).then_some(settings.namespace.as_str());
    let rules = Reader::new(client.clone())
        .within_or_everywhere::<CopyratorRule>(namespace)
        .list(&ListParams::default())
        .await
        .context("listing the CopyratorRules")?
        .items;
    Ok(rules
        .into_iter()
        .filter(|rule| {
            settings
                .rule_name
                .as_deref()
                .is_none_or(|only| rule.key().name == only)
        })
        .collect())
}

/// The kinds the rules copy: ConfigMaps and Secrets, and each kind a rule
/// names by `objectType` that the API server serves.
async fn kinds_of(client: &Client, rules: &[CopyratorRule]) -> anyhow::Result<Vec<Kind>> {
    let mut kinds: Vec<Kind> = Kind::builtin().collect();
    for object_type in rules
        .iter()
        .filter_map(|r| r.spec.as_ref()?.object_type.as_ref())
    {
        let Some((group, version)) = object_type.group_version() else {
            continue;
        };
        let gvk = GroupVersionKind::gvk(group, version, &object_type.kind);
        let Ok((resource, _)) = Reader::new(client.clone()).discover_kind(&gvk).await else {
            // Not served: nothing of it to delete.
            continue;
        };
        let kind = Kind::register(&Discovered {
            group: resource.group,
            version: resource.version,
            kind: resource.kind,
            plural: resource.plural,
        })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

/// Copies listed per request by `release`.
const LIST_PAGE: u32 = 500;

/// Delete every copy of the rules of `uids` in the cluster of `client`,
/// but those handed over to their namespaces; returns how many went.
async fn delete_copies(
    client: &Client,
    kinds: &[Kind],
    uids: &BTreeSet<String>,
) -> anyhow::Result<usize> {
    let mut deleted = 0;
    let writes = ToolWrites::new(client.clone());
    for &kind in kinds {
        let api = Reader::new(client.clone()).of(&kind.api_resource(), None);
        // Metadata only, a page at a time, each deleted before the next is
        // asked for: the Job's memory stays small however many copies, of
        // whatever size, there are.
        let mut page = ListParams::default()
            .labels(LABEL_RULE_UID)
            .limit(LIST_PAGE);
        loop {
            let listed = api
                .list_metadata(&page)
                .await
                .with_context(|| format!("listing the {kind} copies"))?;
            for meta in listed.items {
                let mut object = DynamicObject::new("", &kind.api_resource());
                object.metadata = meta.metadata;
                let copy = Object::from_dynamic(kind, object);
                let ours = copy.rule_uid().is_some_and(|uid| uids.contains(uid));
                if ours && !copy.create_only && delete_copy(&writes, kind, &copy).await? {
                    deleted += 1;
                }
            }
            match listed.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => page = page.continue_token(&next),
                None => break,
            }
        }
    }
    Ok(deleted)
}

/// Delete `copy` (that very object: its UID is a precondition); whether
/// it went (it may have gone already).
async fn delete_copy(writes: &ToolWrites, kind: Kind, copy: &Object) -> anyhow::Result<bool> {
    writes
        .delete_copy(kind, copy)
        .await
        .with_context(|| format!("deleting {kind} {}/{}", copy.namespace, copy.name))
}

/// Remove our finalizer from `rule`, retrying on a newer version; returns
/// whether it had one.
async fn remove_finalizer(client: &Client, rule: &CopyratorRule) -> anyhow::Result<bool> {
    let key = rule.key();
    let writes = ToolWrites::new(client.clone());
    let rules = Reader::new(client.clone()).within::<CopyratorRule>(&key.namespace);
    let mut current = rule.clone();
    for _ in 0..5 {
        if !current.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(false);
        }
        let kept: Vec<&String> = current
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        // The resourceVersion makes this a compare-and-swap of the list.
        match writes
            .rule_finalizers(&key, &kept, current.resource_version())
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match rules.get_opt(&key.name).await {
                    Ok(Some(newer)) => current = newer,
                    Ok(None) => return Ok(false),
                    Err(e) => return Err(e).with_context(|| format!("reading rule {key}")),
                }
            }
            Err(e) => {
                return Err(e).with_context(|| format!("removing the finalizer of rule {key}"));
            }
        }
    }
    bail!("rule {key} kept changing; its finalizer is still there")
}
