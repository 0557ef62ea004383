#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Put an SSH public key on the caller's OS Login profile, and say which user it logs in as.

With OS Login (metadata enable-oslogin=TRUE) a VM ignores ssh-keys metadata: access follows the
account's OS Login profile and IAM, and the login name is the profile's POSIX account (for a service
account `sa_<uniqueId>`), not one the user picks. So forja imports the key and checks that name
against the one Ansible will log in as, before any VM exists.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_os_login_key
short_description: Add an SSH public key to the caller's OS Login profile and return its POSIX user
description:
  - Reads the OS Login profile of O(account) (by default the service account of the credentials)
    and imports O(public_key) with C(users.importSshPublicKey) unless the profile already has it.
  - Returns the profile's primary POSIX username, the name to log in as on VMs with
    C(enable-oslogin=TRUE). With O(expect_user) set, fails naming the right user when they differ.
  - Idempotent, with check mode. Runs on the controller. The key is public; it is still not returned.
version_added: "0.2.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  public_key:
    description: The public key line, C(ssh-ed25519 AAAA... comment).
    type: str
    required: true
  account:
    description: The account whose profile gets the key; empty means the credentials' service account.
    type: str
    default: ""
  expect_user:
    description: The user Ansible will log in as; when set and different from the profile's, fail.
    type: str
    default: ""
  oslogin_url:
    description: Base URL of the OS Login API.
    type: str
    default: https://oslogin.googleapis.com/v1/
notes:
  - Needs the Compute OS Admin Login (or OS Login) IAM role on the project for the account to log in.
seealso:
  - name: OS Login
    description: How OS Login grants SSH access through IAM.
    link: https://cloud.google.com/compute/docs/oslogin
"""

EXAMPLES = r"""
- name: Put the key on my OS Login profile
  forja.gpu.gcp_gpu_os_login_key:
    project: my-project
    public_key: "{{ lookup('ansible.builtin.file', '~/.ssh/google_compute_engine.pub') }}"
  delegate_to: localhost
"""

RETURN = r"""
user:
  description: The profile's primary POSIX username (what to log in as).
  returned: success
  type: str
  sample: sa_101234567890123456789
account:
  description: The account whose profile holds the key.
  returned: success
  type: str
"""

from typing import Any
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import SpecError


def _key_material(line: str) -> tuple[str, str]:
    parts = line.split()
    if len(parts) < 2:
        raise SpecError("public_key: expected 'TYPE BASE64 [COMMENT]', e.g. the content of a .pub file")
    return parts[0], parts[1]


def profile_keys(profile: dict[str, Any]) -> set[str]:
    """The key data (the base64 part) of every key on the profile: a comment change is the same key."""
    found = set()
    for entry in (profile.get("sshPublicKeys") or {}).values():
        words = str(entry.get("key") or "").split()
        if len(words) >= 2:
            found.add(words[1])
    return found


def primary_user(profile: dict[str, Any]) -> str:
    accounts = profile.get("posixAccounts") or []
    chosen = next((a for a in accounts if a.get("primary")), accounts[0] if accounts else {})
    return str(chosen.get("username") or "")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "public_key": {"type": "str", "required": True},
            "account": {"type": "str", "default": ""},
            "expect_user": {"type": "str", "default": ""},
            "oslogin_url": {"type": "str", "default": "https://oslogin.googleapis.com/v1/"},
            **AUTH_ARGUMENT_SPEC,
        },
        mutually_exclusive=[("credentials_file", "credentials_json")],
        supports_check_mode=True,
    )
    params = module.params
    changed = False
    try:
        wanted = _key_material(params["public_key"])
        config = config_from_params(params, "forja-gcp-gpu-os-login-key/0.2")
        project = config.resolved_project()
        if not project:
            raise SpecError("project: not set; set project or FORJA_GCP_PROJECT")
        client = GcpClient(config)
        client.token()
        account = params["account"] or getattr(client._credentials, "service_account_email", "") or ""
        if not account:
            raise SpecError("account: these credentials name no account; give the email of your OS Login "
                            "account (gcp_instance_os_login_account)")
        base = params["oslogin_url"].rstrip("/") + "/users/" + quote(account, safe="@.")
        query = {"projectId": project}
        profile = client.request("GET", base + "/loginProfile", params=query, allow_404=True) or {}
        if wanted[1] not in profile_keys(profile):
            changed = True
            if not module.check_mode:
                answer = client.request("POST", base + ":importSshPublicKey", params=query,
                                        body={"key": params["public_key"].strip()}) or {}
                profile = answer.get("loginProfile") or profile
        user = primary_user(profile)
        if params["expect_user"] and user and user != params["expect_user"]:
            raise SpecError(
                f"OS Login logs {account} in as '{user}', not '{params['expect_user']}': set "
                f"gcp_instance_ssh_user: {user} (inventory/group_vars/all/access.yml, or -e)")
    except SpecError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except GcpError as exc:
        module.fail_json(msg=exc.message, http_status=exc.status, reason=exc.reason)
    module.exit_json(changed=changed, user=user, account=account)


if __name__ == "__main__":
    main()
