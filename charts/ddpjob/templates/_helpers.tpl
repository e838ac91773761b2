{{/*
Names and labels, after Helm's scaffold. Kubernetes names are at most 63 characters.
*/}}

{{/* The chart name (nameOverride is not offered: the app is always ddpjob). */}}
{{- define "ddpjob.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: the release name if it already contains the chart name, else
"<release>-ddpjob". Truncated to 63 characters.
*/}}
{{- define "ddpjob.fullname" -}}
{{- $name := include "ddpjob.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The job's name: values.name (what `controller render --values` writes: the spec's name), else
the release's full name. The operator names pods and services "<job>-worker-<index>" and JobSet
names a TrainJob's pods "<job>-node-0-<index>-<suffix>", which must fit in 63 characters: checked
here as the spec does, so a long name fails at install time instead of leaving a job whose pods
can never be created.
*/}}
{{- define "ddpjob.jobName" -}}
{{- $name := .Values.name | default (include "ddpjob.fullname" .) }}
{{- $longest := "" }}
{{- if eq .Values.api "trainjob" }}
{{- /* JobSet's webhook: "<name>-node-0-<index>" plus the Job controller's 5-character suffix */}}
{{- $longest = printf "%s-node-0-%d-abcde" $name (sub (.Values.nodes | int) 1) }}
{{- else }}
{{- $workers := include "ddpjob.workerReplicas" . | int }}
{{- if kindIs "map" .Values.elastic }}
{{- $workers = .Values.elastic.max_nodes | int }}
{{- end }}
{{- if gt $workers 0 }}
{{- $longest = printf "%s-worker-%d" $name (sub $workers 1) }}
{{- end }}
{{- end }}
{{- if gt (len $longest) 63 }}
{{- fail (printf "name: %q is %d characters; pod and service names hold 63. Shorten name (or the release name)" $longest (len $longest)) }}
{{- end }}
{{- $name }}
{{- end }}

{{/*
A TrainJob cannot carry the PyTorchJob-only values (controller/spec.py PYTORCHJOB_ONLY says
why for each): fail on any that differs from its default, as `validate` fails on a spec that
sets one.
*/}}
{{- define "ddpjob.trainjobFits" -}}
{{- $only := list }}
{{- if kindIs "map" .Values.elastic }}{{ $only = append $only "elastic" }}{{ end }}
{{- if kindIs "map" .Values.gang }}{{ $only = append $only "gang" }}{{ end }}
{{- if and .Values.priority_class (not .Values.queue) }}{{ $only = append $only "priority_class" }}{{ end }}
{{- if ne .Values.restart_policy "ExitCode" }}{{ $only = append $only "restart_policy" }}{{ end }}
{{- if ne (.Values.backoff_limit | int) 3 }}{{ $only = append $only "backoff_limit" }}{{ end }}
{{- if not (kindIs "invalid" .Values.ttl_after_finished_s) }}{{ $only = append $only "ttl_after_finished_s" }}{{ end }}
{{- if .Values.clean_pod_policy }}{{ $only = append $only "clean_pod_policy" }}{{ end }}
{{- with $only }}
{{- fail (printf "%s: a TrainJob cannot carry it (api: trainjob). Remove it, or use api: pytorchjob; `python -m controller validate` says why" (join ", " .)) }}
{{- end }}
{{- include "ddpjob.rank0VolumesFit" . }}
{{- end }}

{{/*
A rank0_only volume needs a pod that is rank 0's before the job starts: a PyTorchJob's Master.
A TrainJob's pods share one template and an elastic job's rendezvous picks rank 0: fail there,
as `validate` does.
*/}}
{{- define "ddpjob.rank0VolumesFit" -}}
{{- $got := "" }}
{{- if eq .Values.api "trainjob" }}{{ $got = "api trainjob" }}{{ else if kindIs "map" .Values.elastic }}{{ $got = "elastic" }}{{ end }}
{{- if $got }}
{{- range $i, $v := .Values.volumes }}
{{- if $v.rank0_only }}
{{- fail (printf "volumes.%d.rank0_only: no pod is rank 0's before the job starts (got %s, volume %s). Use checkpoint.dir: s3://..., or a ReadWriteMany claim mounted on every pod; `python -m controller validate` says why" $i $got $v.name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The PyTorchJob's cleanPodPolicy: clean_pod_policy, else None for an elastic job (the operator ends
one as soon as any worker succeeds: keep the workers still finishing) and Running for the rest.
An elastic job with Running fails, as `validate` fails on such a spec.
*/}}
{{- define "ddpjob.cleanPodPolicy" -}}
{{- $elastic := kindIs "map" .Values.elastic }}
{{- if and $elastic (eq .Values.clean_pod_policy "Running") }}
{{- fail "clean_pod_policy: Running deletes the pods still running when the job ends, and the operator ends an elastic job as soon as any worker succeeds (got Running with elastic). Remove clean_pod_policy, or set None or All; `python -m controller validate` says why" }}
{{- end }}
{{- .Values.clean_pod_policy | default (ternary "None" "Running" $elastic) }}
{{- end }}

{{/* The job's namespace: values.namespace, else the release's. */}}
{{- define "ddpjob.namespace" -}}
{{- .Values.namespace | default .Release.Namespace }}
{{- end }}

{{/* Worker replicas: nodes - 1 beside the Master; elastic jobs have Workers only (= nodes). */}}
{{- define "ddpjob.workerReplicas" -}}
{{- if kindIs "map" .Values.elastic }}
{{- .Values.nodes | int }}
{{- else }}
{{- sub (.Values.nodes | int) 1 }}
{{- end }}
{{- end }}

{{/* chart name and version, for the helm.sh/chart label. */}}
{{- define "ddpjob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels. instance is the job's name, not the release's: the chart and
`python -m controller` label one job the same way, whichever tool created it.
*/}}
{{- define "ddpjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob.name" . }}
app.kubernetes.io/instance: {{ include "ddpjob.jobName" . | quote }}
{{- end }}

{{/* Standard labels on the job and its pods; the user's labels are added where used. */}}
{{- define "ddpjob.labels" -}}
helm.sh/chart: {{ include "ddpjob.chart" . }}
{{ include "ddpjob.selectorLabels" . }}
app.kubernetes.io/component: trainer
app.kubernetes.io/part-of: ddpjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
