//! Requests for one namespaced resource, sent as an [`Identity`]: the
//! operator's own, or a ServiceAccount it impersonates. The identity is a
//! header of each request (`Impersonate-User`), so every identity rides on
//! the connections the operator already holds: no client, and no
//! connection, per identity, and `--write-concurrency` bounds them all.
//!
//! kube's `Api` builds and sends its requests in one call and offers no
//! hook to add a header per request (a layer below the client would run in
//! the client's buffer task, away from the caller's context), so these are
//! built with kube's own request builder and sent with the client.

use http::HeaderValue;
use kube::Client;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, Resource};
use serde_json::Value;

use crate::core::identity::Identity;

/// The header that names whom a request acts as.
const IMPERSONATE_USER: &str = "Impersonate-User";

/// The impersonation extra that says a request as a ServiceAccount is
/// the operator acting for a rule, not the account acting alone with its
/// own token (which cannot set it: the API server asks whether the sender
/// may `impersonate` `userextras/copyrator.flant.com/acting-for`).
/// Admission sees it in `request.userInfo.extra`: the chart's copy
/// protection lets such writes through.
pub(crate) const ACTING_FOR_EXTRA: &str = "copyrator.flant.com/acting-for";
/// Its value: the only one the chart lets the operator set.
pub(crate) const ACTING_FOR_VALUE: &str = "copyrator";

/// [`ACTING_FOR_EXTRA`] as a header: `Impersonate-Extra-` and the key,
/// its `/` percent-encoded, as the API server decodes it.
fn acting_for_header() -> http::HeaderName {
    let name = format!("impersonate-extra-{}", ACTING_FOR_EXTRA.replace('/', "%2F"));
    http::HeaderName::from_bytes(name.as_bytes())
        .unwrap_or_else(|_| unreachable!("a constant of header characters: {name}"))
}

/// Requests for `resource` in one namespace, as one identity.
pub(crate) struct Requests<'a> {
    client: &'a Client,
    builder: kube::core::Request,
    identity: &'a Identity,
    /// Whether a request as a ServiceAccount carries [`ACTING_FOR_EXTRA`].
    acting_for: bool,
}

impl<'a> Requests<'a> {
    pub(crate) fn new(
        client: &'a Client,
        resource: &ApiResource,
        namespace: &str,
        identity: &'a Identity,
    ) -> Self {
        Self {
            client,
            builder: kube::core::Request::new(DynamicObject::url_path(resource, Some(namespace))),
            identity,
            acting_for: false,
        }
    }

    /// Requests as a ServiceAccount carry [`ACTING_FOR_EXTRA`] when `on`.
    pub(crate) fn acting_for(mut self, on: bool) -> Self {
        self.acting_for = on;
        self
    }

    /// `request` as this identity.
    fn stamped(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> kube::Result<http::Request<Vec<u8>>> {
        let mut request = request.map_err(kube::Error::BuildRequest)?;
        if let Some(user) = self.identity.impersonated_user() {
            let value = HeaderValue::from_str(&user).map_err(|_| {
                kube::Error::BuildRequest(kube::core::request::Error::Validation(format!(
                    "{user:?} cannot be sent as a user name"
                )))
            })?;
            request.headers_mut().insert(IMPERSONATE_USER, value);
            if self.acting_for {
                request.headers_mut().insert(
                    acting_for_header(),
                    HeaderValue::from_static(ACTING_FOR_VALUE),
                );
            }
        }
        Ok(request)
    }

    pub(crate) async fn create(
        &self,
        params: &PostParams,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
        let request = self.stamped(self.builder.create(params, body))?;
        self.client.request(request).await
    }

    pub(crate) async fn replace(
        &self,
        name: &str,
        params: &PostParams,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
        let request = self.stamped(self.builder.replace(name, params, body))?;
        self.client.request(request).await
    }

    pub(crate) async fn patch(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<&Value>,
    ) -> kube::Result<DynamicObject> {
        let request = self.stamped(self.builder.patch(name, params, patch))?;
        self.client.request(request).await
    }

    /// Delete; what the API server answers (the object, or a Status) is
    /// not needed.
    pub(crate) async fn delete(&self, name: &str, params: &DeleteParams) -> kube::Result<()> {
        let request = self.stamped(self.builder.delete(name, params))?;
        self.client.request_text(request).await.map(|_| ())
    }

    /// The object, or None where there is none.
    pub(crate) async fn get_opt(&self, name: &str) -> kube::Result<Option<DynamicObject>> {
        let request = self.stamped(self.builder.get(name, &Default::default()))?;
        match self.client.request(request).await {
            Ok(object) => Ok(Some(object)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(identity: &Identity) -> http::Request<Vec<u8>> {
        built_acting_for(identity, false)
    }

    fn built_acting_for(identity: &Identity, acting_for: bool) -> http::Request<Vec<u8>> {
        let client = crate::cluster::fake_objects::never_asked_client();
        let resource = crate::api::kinds::Kind::Secret.api_resource();
        let requests = Requests::new(&client, &resource, "team-b", identity).acting_for(acting_for);
        requests
            .stamped(requests.builder.delete("pull", &DeleteParams::default()))
            .expect("a request")
    }

    #[tokio::test]
    async fn a_service_accounts_request_names_it_as_the_user_impersonated() {
        let identity = Identity::ServiceAccount {
            namespace: "team-a".into(),
            name: "copyrator".into(),
        };
        let request = built(&identity);
        assert_eq!(
            request.headers().get(IMPERSONATE_USER),
            Some(&HeaderValue::from_static(
                "system:serviceaccount:team-a:copyrator"
            ))
        );
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/team-b/secrets/pull"
        );
    }

    #[tokio::test]
    async fn the_operators_own_request_impersonates_nobody() {
        let request = built(&Identity::Operator);
        assert!(request.headers().get(IMPERSONATE_USER).is_none());
        assert!(
            request
                .headers()
                .keys()
                .all(|h| !h.as_str().starts_with("impersonate-"))
        );
    }

    #[tokio::test]
    async fn the_acting_for_extra_goes_with_a_service_accounts_request_only_when_asked() {
        let account = Identity::ServiceAccount {
            namespace: "team-a".into(),
            name: "copyrator".into(),
        };
        let extra = |request: &http::Request<Vec<u8>>| {
            request
                .headers()
                .iter()
                .filter(|(name, _)| name.as_str().starts_with("impersonate-extra-"))
                .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("?")))
                .collect::<Vec<_>>()
        };
        // The API server percent-decodes the key after the prefix.
        assert_eq!(
            extra(&built_acting_for(&account, true)),
            ["impersonate-extra-copyrator.flant.com%2facting-for: copyrator"]
        );
        assert!(extra(&built_acting_for(&account, false)).is_empty());
        let operator = built_acting_for(&Identity::Operator, true);
        assert!(
            operator
                .headers()
                .keys()
                .all(|h| !h.as_str().starts_with("impersonate-")),
            "the operator's own requests impersonate nobody"
        );
    }
}
