//! Whether the chart's copy protection is in force, as its
//! ValidatingAdmissionPolicy and binding stand: whoever deletes or weakens
//! either turns it off without a word from the API server, so the operator
//! says it (`copyrator_copy_protection_in_force`, a Warning Event).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec,
};

use crate::api::required;

/// Why the protection named `name` (its policy's and binding's name) is
/// not in force; `Ok` when it is.
pub(crate) fn judge(
    name: &str,
    policy: Option<&ValidatingAdmissionPolicy>,
    binding: Option<&ValidatingAdmissionPolicyBinding>,
) -> Result<(), String> {
    let policy =
        policy.ok_or_else(|| format!("the ValidatingAdmissionPolicy {name} is missing"))?;
    let binding =
        binding.ok_or_else(|| format!("the ValidatingAdmissionPolicyBinding {name} is missing"))?;
    let bound: ValidatingAdmissionPolicyBindingSpec = required(binding.spec.clone());
    let bound_policy: String = required(bound.policy_name.clone());
    if bound_policy != name {
        return Err(format!(
            "the ValidatingAdmissionPolicyBinding {name} binds {bound_policy:?}, not the policy {name}"
        ));
    }
    let actions: Vec<String> = required(bound.validation_actions.clone());
    if actions.is_empty() {
        return Err(format!(
            "the ValidatingAdmissionPolicyBinding {name} takes no action"
        ));
    }
    let spec: ValidatingAdmissionPolicySpec = required(policy.spec.clone());
    let failure_policy: String = required(spec.failure_policy.clone());
    if failure_policy == "Ignore" {
        return Err(format!(
            "the ValidatingAdmissionPolicy {name} lets writes through when it fails (failurePolicy Ignore)"
        ));
    }
    let validations: Vec<_> = required(spec.validations.clone());
    let refuses = validations.iter().any(|v| v.expression.trim() == "false");
    if !refuses {
        return Err(format!(
            "the ValidatingAdmissionPolicy {name} was changed: none of its validations refuses"
        ));
    }
    let warnings: Vec<String> = policy
        .status
        .as_ref()
        .and_then(|s| s.type_checking.as_ref())
        .and_then(|t| t.expression_warnings.as_ref())
        .into_iter()
        .flatten()
        .map(|w| format!("{}: {}", w.field_ref, w.warning))
        .collect();
    if !warnings.is_empty() {
        return Err(format!(
            "the ValidatingAdmissionPolicy {name} fails type checking: {}",
            warnings.join("; ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NAME: &str = "copyrator-copies-read-only";

    fn policy(spec: serde_json::Value) -> ValidatingAdmissionPolicy {
        serde_json::from_value(json!({"metadata": {"name": NAME}, "spec": spec})).expect("a policy")
    }

    fn refusing() -> ValidatingAdmissionPolicy {
        policy(json!({"failurePolicy": "Fail", "validations": [{"expression": "false"}]}))
    }

    fn binding(spec: serde_json::Value) -> ValidatingAdmissionPolicyBinding {
        serde_json::from_value(json!({"metadata": {"name": NAME}, "spec": spec}))
            .expect("a binding")
    }

    fn denying() -> ValidatingAdmissionPolicyBinding {
        binding(json!({"policyName": NAME, "validationActions": ["Deny"]}))
    }

    #[test]
    fn the_charts_policy_and_binding_are_in_force() {
        assert_eq!(judge(NAME, Some(&refusing()), Some(&denying())), Ok(()));
    }

    #[test]
    fn a_missing_weakened_or_unchecked_policy_or_binding_is_said() {
        let said = |p: Option<&ValidatingAdmissionPolicy>,
                    b: Option<&ValidatingAdmissionPolicyBinding>| {
            judge(NAME, p, b).expect_err("not in force")
        };
        assert!(
            said(None, Some(&denying()))
                .contains("ValidatingAdmissionPolicy copyrator-copies-read-only is missing")
        );
        assert!(
            said(Some(&refusing()), None).contains("Binding copyrator-copies-read-only is missing")
        );
        let elsewhere = binding(json!({"policyName": "other", "validationActions": ["Deny"]}));
        assert!(said(Some(&refusing()), Some(&elsewhere)).contains("binds \"other\""));
        let idle = binding(json!({"policyName": NAME}));
        assert!(said(Some(&refusing()), Some(&idle)).contains("takes no action"));
        let open =
            policy(json!({"failurePolicy": "Ignore", "validations": [{"expression": "false"}]}));
        assert!(said(Some(&open), Some(&denying())).contains("failurePolicy Ignore"));
        let lets_through = policy(json!({"validations": [{"expression": "true"}]}));
        assert!(
            said(Some(&lets_through), Some(&denying())).contains("none of its validations refuses")
        );
        let mut unchecked = refusing();
        unchecked.status = serde_json::from_value(json!({"typeChecking": {"expressionWarnings": [
            {"fieldRef": "spec.validations[0].expression", "warning": "no such key"}]}}))
        .expect("a status");
        assert!(
            said(Some(&unchecked), Some(&denying()))
                .contains("fails type checking: spec.validations[0].expression: no such key")
        );
    }
}
