{{/* The release's full name: the release name, or release-chart when the release name lacks it. */}}
{{- define "dbq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dbq.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dbq.labels" -}}
{{ include "dbq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dbq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dbq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's rights on Queues, their Secrets and Events: one list for a Role and a ClusterRole. */}}
{{- define "dbq.queueRules" -}}
# Queues, Topics, Subscriptions, QueueUsers and QueueConsumers: watch them, add/remove our finalizer
# and annotations, write status.
- apiGroups: [dbq.dev]
  resources: [queues, topics, subscriptions, queueusers, queueconsumers]
  verbs: [get, list, watch, patch]
- apiGroups: [dbq.dev]
  resources: [queues/status, topics/status, subscriptions/status, queueusers/status, queueconsumers/status]
  verbs: [get, patch]
# A QueueConsumer's monitor-only QueueUser (written and deleted with it), and its KEDA objects.
- apiGroups: [dbq.dev]
  resources: [queueusers]
  verbs: [create, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects, scaledjobs, triggerauthentications]
  verbs: [get, list, create, patch, delete]
# A QueueConsumer's workload, the HPA KEDA made for it and the Jobs of a ScaledJob: read only,
# for its status.
- apiGroups: [apps]
  resources: [deployments, statefulsets]
  verbs: [get]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list]
# Connection details: read the one Secret a Queue names, and write the Secret of each QueueUser's
# login (owned by the QueueUser; never list or watch Secrets, never delete one).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
# Events about Queues, Topics and Subscriptions.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* kopf watches which resources and namespaces exist: read-only, cluster scope. */}}
{{- define "dbq.discoveryRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end -}}
