# Copyright: forja contributors
# Apache-2.0
"""The Compute API connection and credential options shared by forja.gpu's GCP plugins.

One description of them for ansible-doc, as amazon.aws does for its credentials: the modules
(gcp_gpu_instance, gcp_gpu_firewall, gcp_gpu_bucket...) extend ``forja.gpu.gcp_auth`` and
``forja.gpu.gcp_auth.modules`` (the Cloud Storage ones ``forja.gpu.gcp_auth.storage`` too), the
gcp_gpu inventory plugin extends ``forja.gpu.gcp_auth``. The options themselves are read in one
place, plugins/module_utils/forja_gcp.py (AUTH_ARGUMENT_SPEC, GcpConfig), which also fills what they
leave empty from the FORJA_GCP_* variables: a module's options have no ``env:`` entries (Ansible
honours those for plugins only), so the variables are named in the notes instead.
"""

from __future__ import annotations


class ModuleDocFragment:
    # Where the Compute API is and how to authenticate to it: every GCP plugin.
    DOCUMENTATION = r"""
notes:
  - The connection options fall back on environment variables when unset, read by the plugin's own
    code (plugins/module_utils/forja_gcp.py), so the same variables serve the modules, the inventory
    plugin and forja's CLI. E(FORJA_GCP_API_URL) for O(api_url), E(FORJA_GCP_CREDENTIALS_FILE) for
    O(credentials_file), E(FORJA_GCP_ACCESS_TOKEN) for O(access_token), E(FORJA_GCP_PROJECT) for the
    project. An option that is set wins over its variable.
options:
  api_url:
    description:
      - Compute API base URL; defaults to E(FORJA_GCP_API_URL), else C(https://compute.googleapis.com/compute/v1/).
      - Point it at the local emulator for tests and the sandbox.
    type: str
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
  access_token:
    description: An OAuth access token (never logged); defaults to E(FORJA_GCP_ACCESS_TOKEN).
    type: str
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

    # The Cloud Storage modules' switch to an emulator, read by one helper
    # (plugins/module_utils/forja_gcp_storage.py, emulator_host).
    STORAGE = r"""
options:
  storage_emulator_host:
    description:
      - A Cloud Storage emulator to talk to instead of Google's endpoint, without credentials, as
        google-cloud-storage does. For tests and local clouds.
      - Defaults to E(STORAGE_EMULATOR_HOST), which the module reads itself when this is not set.
    type: str
"""
