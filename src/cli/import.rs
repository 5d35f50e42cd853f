//! `copyrator import`: the other copying tools' configuration (Kyverno's
//! generate policies, the reflector, replicator and config-syncer
//! annotations, ClusterSecrets), read from the live cluster or from files,
//! printed as CopyratorRules that do the same, with adoption on, and a
//! report per source (`core::import` converts; this reads and prints).
//!
//! From the cluster, ConfigMaps and Secrets are listed as metadata only:
//! the annotations are all the conversion reads of them, so no Secret's
//! data is fetched. Nothing is written.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use futures::StreamExt;
use kube::api::{DynamicObject, ListParams, ObjectMeta, PartialObjectMeta};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::Value;

use crate::cli::report::EXIT_FAILED;
use crate::cli::settings::{ImportArgs, ImportOutput, Settings};
use crate::cluster::reader::{Objects, Reader};
use crate::core::import::{Imported, Options, import};

/// `copyrator import`: the configuration read (files first: a broken file
/// needs no cluster), converted, printed on standard output; exit 0, or 1
/// on an error.
pub(crate) fn import_command(settings: Settings, args: ImportArgs) -> ExitCode {
    let failed = ExitCode::from(EXIT_FAILED);
    let objects = if args.files.is_empty() {
        let builder = tokio::runtime::Builder::new_multi_thread();
        let runtime = match crate::cli::start_runtime(builder, failed) {
            Ok(runtime) => runtime,
            Err(code) => return code,
        };
        runtime.block_on(read_cluster(&settings))
    } else {
        read_files(&args.files)
    };
    let objects = match objects {
        Ok(objects) => objects,
        Err(e) => {
            eprintln!("error: {e:#}");
            return failed;
        }
    };
    let imported = import(
        &objects,
        &Options {
            rule_namespace: settings.namespace.clone(),
        },
    );
    let printed = match args.output {
        ImportOutput::Yaml => yaml(&imported),
        ImportOutput::Json => serde_json::to_string_pretty(&imported)
            .map(|mut text| {
                text.push('\n');
                text
            })
            .context("printing the import as JSON"),
    };
    let written = printed.and_then(|text| {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .context("writing the import to standard output")
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            failed
        }
    }
}

/// The objects of the `-f` files (`-` is standard input): YAML documents
/// separated by `---`, each an object or a `List` of them.
fn read_files(files: &[PathBuf]) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for path in files {
        let (file, text) = if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            ("standard input".to_owned(), text)
        } else {
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {file}"))?;
            (file, text)
        };
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(document)
                .with_context(|| format!("{file}, document {}: not YAML", index + 1))?;
            match value {
                Value::Null => {}
                Value::Object(ref object)
                    if object.get("kind").and_then(Value::as_str) == Some("List") =>
                {
                    if let Some(Value::Array(items)) = object.get("items") {
                        objects.extend(items.iter().cloned());
                    }
                }
                other => objects.push(other),
            }
        }
    }
    Ok(objects)
}

/// The kinds whose objects are the other tools' configuration, by group,
/// version and kind; a kind the API server does not serve is passed over.
const POLICY_KINDS: &[(&str, &str, &str, &str)] = &[
    ("kyverno.io", "v1", "ClusterPolicy", "clusterpolicies"),
    ("kyverno.io", "v1", "Policy", "policies"),
    (
        "policies.kyverno.io",
        "v1",
        "GeneratingPolicy",
        "generatingpolicies",
    ),
    (
        "policies.kyverno.io",
        "v1beta1",
        "GeneratingPolicy",
        "generatingpolicies",
    ),
    (
        "policies.kyverno.io",
        "v1alpha1",
        "GeneratingPolicy",
        "generatingpolicies",
    ),
    ("clustersecret.io", "v1", "ClusterSecret", "clustersecrets"),
];

/// Every object of the live cluster that may be another tool's
/// configuration: the policies and ClusterSecrets whole, and the
/// ConfigMaps and Secrets as metadata (what their annotations say).
async fn read_cluster(settings: &Settings) -> anyhow::Result<Vec<Value>> {
    crate::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = crate::cli::run::api_clients(settings.api_transport, 1).await?;
    let client = clients.read.clone();
    let mut objects = Vec::new();
    let mut generating_found = false;
    for (group, version, kind, plural) in POLICY_KINDS {
        // One served version of GeneratingPolicy is enough: they are the
        // same objects.
        if *kind == "GeneratingPolicy" && generating_found {
            continue;
        }
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api = Reader::new(client.clone()).of(&resource, None);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                generating_found |= *kind == "GeneratingPolicy";
                for mut item in list.items {
                    // A list's items come without their type.
                    item.types = Some(kube::core::TypeMeta {
                        api_version: resource.api_version.clone(),
                        kind: (*kind).to_owned(),
                    });
                    objects.push(serde_json::to_value(item).context("an object as JSON")?);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("listing {kind} ({group}/{version})"));
            }
        }
    }
    for (kind, plural) in [("ConfigMap", "configmaps"), ("Secret", "secrets")] {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", kind), plural);
        let api = Reader::new(client.clone()).of(&resource, None);
        let mut pages = std::pin::pin!(list_metadata(&api));
        while let Some(page) = pages.next().await {
            for meta in page.with_context(|| format!("listing the {kind}s' metadata"))? {
                objects.push(metadata_object(kind, meta));
            }
        }
    }
    Ok(objects)
}

/// The metadata of every object `api` lists, 500 at a time.
fn list_metadata(
    api: &Objects<DynamicObject>,
) -> impl futures::Stream<Item = kube::Result<Vec<ObjectMeta>>> + '_ {
    futures::stream::unfold(Some(None::<String>), move |next| async move {
        let token = next?;
        let mut params = ListParams::default().limit(500);
        if let Some(token) = token {
            params = params.continue_token(&token);
        }
        match api.list_metadata(&params).await {
            Ok(page) => {
                let more = page.metadata.continue_.filter(|t| !t.is_empty());
                let metas = page
                    .items
                    .into_iter()
                    .map(|item: PartialObjectMeta<DynamicObject>| item.metadata)
                    .collect();
                Some((Ok(metas), more.map(Some)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// An object of `kind` with `meta` and no payload, as the conversion reads it.
fn metadata_object(kind: &str, meta: ObjectMeta) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": meta})
}

/// The import as YAML: the report and the labels to put on sources as
/// comments, then a document per rule.
fn yaml(imported: &Imported) -> anyhow::Result<String> {
    let mut out = String::from(
        "# copyrator import: rules that do what the other tools' configuration does, with adopt: true\n",
    );
    for report in &imported.reports {
        out.push_str(&format!("#\n# {}: {}\n", report.tool, report.source));
        if !report.rules.is_empty() {
            out.push_str(&format!("#   rules: {}\n", report.rules.join(", ")));
        }
        for (what, lines) in [
            ("exact", &report.exact),
            ("differs", &report.differs),
            ("unmapped", &report.unmapped),
        ] {
            for line in lines {
                out.push_str(&format!("#   {what}: {line}\n"));
            }
        }
    }
    if !imported.source_labels.is_empty() {
        out.push_str("#\n# Label these sources before applying the rules (each rule selects its sources by its label):\n");
        for label in &imported.source_labels {
            out.push_str(&format!(
                "#   kubectl label {} -n {} {} {}={}\n",
                label.kind.to_ascii_lowercase(),
                label.namespace,
                label.name,
                label.key,
                label.value
            ));
        }
    }
    for rule in &imported.rules {
        out.push_str("---\n");
        out.push_str(&crate::yaml::to_string(rule));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::import::{SourceLabel, SourceReport};

    #[test]
    fn files_give_their_objects_and_the_items_of_their_lists() {
        let dir = std::env::temp_dir().join(format!("copyrator-import-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let file = dir.join("in.yaml");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n\
             - {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n---\n---\n\
             apiVersion: kyverno.io/v1\nkind: ClusterPolicy\nmetadata: {name: p}\n",
        )
        .expect("written");
        let objects = read_files(&[file]).expect("read");
        let names: Vec<&str> = objects
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["a", "b", "p"]);
        let broken = dir.join("broken.yaml");
        std::fs::write(&broken, "a: [\n").expect("written");
        let error = read_files(&[broken]).expect_err("not YAML");
        assert!(format!("{error:#}").contains("document 1"), "{error:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn yaml_says_the_reports_and_labels_as_comments_then_the_rules() {
        let imported = Imported {
            rules: vec![serde_json::json!({
                "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
                "metadata": {"name": "r", "namespace": "copyrator"},
                "spec": {"adopt": true},
            })],
            source_labels: vec![SourceLabel {
                kind: "Secret".into(),
                api_version: "v1".into(),
                namespace: "certs".into(),
                name: "tls".into(),
                key: "copyrator.flant.com/import.r".into(),
                value: "true".into(),
            }],
            reports: vec![SourceReport {
                tool: "kubernetes-reflector".into(),
                source: "Secret certs/tls".into(),
                rules: vec!["r".into()],
                exact: vec!["one".into()],
                differs: vec!["two".into()],
                unmapped: vec![],
            }],
        };
        let text = yaml(&imported).expect("YAML");
        let comments: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(
            comments[1..],
            [
                "#",
                "# kubernetes-reflector: Secret certs/tls",
                "#   rules: r",
                "#   exact: one",
                "#   differs: two",
                "#",
                "# Label these sources before applying the rules (each rule selects its sources by its label):",
                "#   kubectl label secret -n certs tls copyrator.flant.com/import.r=true",
            ]
        );
        let rules: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(Value::deserialize)
            .collect::<Result<_, _>>()
            .expect("YAML documents");
        assert_eq!(rules.last(), imported.rules.last());
    }
}
