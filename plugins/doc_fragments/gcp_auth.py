# Copyright: forja contributors
# Apache-2.0
"""The Compute API connection and credential options shared by forja.gpu's GCP plugins.

One description of them for ansible-doc, as amazon.aws does for its credentials: the modules
(gcp_gpu_instance, gcp_gpu_firewall, gcp_gpu_bucket) extend ``forja.gpu.gcp_auth`` and
``forja.gpu.gcp_auth.modules``, the gcp_gpu inventory plugin extends ``forja.gpu.gcp_auth``. The
options themselves are read in one place, plugins/module_utils/forja_gcp.py (AUTH_ARGUMENT_SPEC,
GcpConfig), which also fills what they leave empty from the FORJA_GCP_* variables.
"""

from __future__ import annotations


class ModuleDocFragment:
    # Where the Compute API is and how to authenticate to it: every GCP plugin.
    DOCUMENTATION = r"""
options:
  api_url:
    description:
      - Compute API base URL; defaults to E(FORJA_GCP_API_URL), else C(https://compute.googleapis.com/compute/v1/).
      - Point it at the local emulator for tests and the sandbox.
    type: str
    env:
      - name: FORJA_GCP_API_URL
  auth_kind:
    description:
      - C(auto) uses a service-account key (O(credentials_file) or E(FORJA_GCP_CREDENTIALS_FILE), or
        C(credentials_json) where the plugin takes it) if given, else O(access_token) (or
        E(FORJA_GCP_ACCESS_TOKEN)), else application default credentials.
      - C(serviceaccount) requires the key, C(accesstoken) the token; C(application) uses application default
        credentials.
      - C(machineaccount) uses the metadata server of the GCE VM Ansible runs on.
    type: str
    default: auto
    choices: [auto, serviceaccount, application, accesstoken, machineaccount]
  credentials_file:
    description: Path of a service-account JSON key; defaults to E(FORJA_GCP_CREDENTIALS_FILE).
    type: path
    env:
      - name: FORJA_GCP_CREDENTIALS_FILE
  access_token:
    description: An OAuth access token (never logged); defaults to E(FORJA_GCP_ACCESS_TOKEN).
    type: str
    env:
      - name: FORJA_GCP_ACCESS_TOKEN
  request_timeout:
    description: Seconds to wait for one HTTP answer.
    type: float
    default: 30.0
"""

    # What the modules add: the project, a key given inline, and how long an operation may take.
    MODULES = r"""
options:
  project:
    description: GCP project ID. Defaults to the environment variable E(FORJA_GCP_PROJECT).
    type: str
  credentials_json:
    description: The service-account JSON key itself (never logged).
    type: str
  operation_timeout:
    description: Seconds to wait for one operation (insert, start, stop, delete, a firewall change) to finish.
    type: float
    default: 900.0
"""
