{{/*
The pod both job APIs carry, in pieces (controller/render/pod.py builds the same): labels and
annotations, the restricted Pod Security profile, a memory-backed /dev/shm and a writable /tmp
for the non-root user, the PVC mounts, env and resources. The PyTorchJob's Master and Worker
replicas use ddpjob.podTemplate whole; the TrainJob puts the pieces into spec.trainer and its
runtimePatches. A context with `workers: true` (the PyTorchJob's Worker replicas) leaves out the
rank0_only volumes.
*/}}

{{/*
Pod metadata: the standard labels and the user's; the prometheus.io annotations where the
trainer serves metrics (metrics_port > 0), then the user's annotations (which may override them).
*/}}
{{- define "ddpjob.podMetadata" -}}
labels:
  {{- include "ddpjob.labels" . | nindent 2 }}
  {{- with .Values.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $annotations := dict }}
{{- if gt (.Values.metrics_port | int) 0 }}
{{- $_ := set $annotations "prometheus.io/scrape" "true" }}
{{- $_ := set $annotations "prometheus.io/port" (.Values.metrics_port | int | toString) }}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" }}
{{- end }}
{{- range $k, $v := .Values.annotations }}
{{- $_ := set $annotations $k $v }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The pod-level fields before the containers, as both APIs' pods get them (render's pod_spec):
serviceAccountName, the pods' PriorityClass (not with a queue: then it is Kueue's), the gang's
scheduler, placement, the grace period, the pod's security context. A TrainJob never has a
priority class without a queue nor a gang: ddpjob.trainjobFits refuses them.
*/}}
{{- define "ddpjob.podFields" -}}
{{- with .Values.service_account }}
serviceAccountName: {{ . | quote }}
{{- end }}
{{- if not .Values.queue }}
{{- with .Values.priority_class }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end }}
{{- if kindIs "map" .Values.gang }}
{{- with .Values.gang.scheduler_name }}
schedulerName: {{ . | quote }}
{{- end }}
{{- end }}
{{- include "ddpjob.placement" . }}
{{- include "ddpjob.gracePeriod" . }}
{{ include "ddpjob.podSecurityContext" . }}
{{- end }}

{{/* nodeSelector, tolerations and imagePullSecrets (each when set). */}}
{{- define "ddpjob.placement" -}}
{{- with .Values.node_selector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- range . }}
  - {{- if hasKey . "key" }}
    key: {{ .key | quote }}
    {{- end }}
    operator: {{ .operator | default "Equal" }}
    {{- if hasKey . "value" }}
    value: {{ .value | quote }}
    {{- end }}
    {{- if hasKey . "effect" }}
    effect: {{ .effect }}
    {{- end }}
    {{- if hasKey . "toleration_s" }}
    tolerationSeconds: {{ .toleration_s | int }}
    {{- end }}
  {{- end }}
{{- end }}
{{- with .Values.image_pull_secrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The pod's half of the restricted profile, as the image's user (uid 1000). */}}
{{- define "ddpjob.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* The container's half of the restricted profile. */}}
{{- define "ddpjob.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
  runAsNonRoot: true
{{- end }}

{{/* terminationGracePeriodSeconds (when set). */}}
{{- define "ddpjob.gracePeriod" -}}
{{- if not (kindIs "invalid" .Values.grace_period_s) }}
terminationGracePeriodSeconds: {{ .Values.grace_period_s | int }}
{{- end }}
{{- end }}

{{/*
What the trainer reads of its pod and job, each unless the user sets it: the pod's node, the
job's name, namespace, API and image; then the user's env entries in order, Secret references,
the grace period for the trainer (when set), and a shipped workdir's PYTHONPATH and
DDPJOB_WORKDIR_* (a list body).
*/}}
{{- define "ddpjob.envEntries" -}}
{{- $workdir := .Values.workdir }}
{{- $own := dict }}
{{- range (concat .Values.env .Values.secret_env) }}
{{- $_ := set $own .name true }}
{{- end }}
{{- if not (hasKey $own "NODE_NAME") }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- if not (hasKey $own "DDPJOB_JOB_NAME") }}
- name: DDPJOB_JOB_NAME
  value: {{ include "ddpjob.jobName" . | quote }}
{{- end }}
{{- if not (hasKey $own "DDPJOB_NAMESPACE") }}
- name: DDPJOB_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- if not (hasKey $own "DDPJOB_JOB_API") }}
- name: DDPJOB_JOB_API
  value: {{ .Values.api | quote }}
{{- end }}
{{- if not (hasKey $own "DDPJOB_IMAGE") }}
- name: DDPJOB_IMAGE
  value: {{ .Values.image | quote }}
{{- end }}
{{- range .Values.env }}
- name: {{ .name | quote }}
  {{- if and $workdir (eq .name "PYTHONPATH") }}
  value: {{ printf "/workdir:%s" (.value | toString) | quote }}
  {{- else }}
  value: {{ .value | toString | quote }}
  {{- end }}
{{- end }}
{{- range .Values.secret_env }}
- name: {{ .name | quote }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.grace_period_s) }}
- name: DDPJOB_GRACE_PERIOD_S
  value: {{ .Values.grace_period_s | int | toString | quote }}
{{- end }}
{{- if $workdir }}
{{- include "ddpjob.workdirEnv" . }}
{{- end }}
{{- end }}

{{/* Limits and requests, equal; GPUs as a limit only. */}}
{{- define "ddpjob.resources" -}}
limits:
  {{- if gt (.Values.resources.gpus | int) 0 }}
  nvidia.com/gpu: {{ .Values.resources.gpus | int }}
  {{- end }}
  cpu: {{ .Values.resources.cpu | toString | quote }}
  memory: {{ .Values.resources.memory | toString | quote }}
requests:
  cpu: {{ .Values.resources.cpu | toString | quote }}
  memory: {{ .Values.resources.memory | toString | quote }}
{{- end }}

{{/* /dev/shm, /tmp and the PVCs, mounted. */}}
{{- define "ddpjob.volumeMounts" -}}
{{- $workers := .workers | default false }}
volumeMounts:
  - name: dshm
    mountPath: /dev/shm
  - name: tmp
    mountPath: /tmp
  {{- range .Values.volumes }}
  {{- if not (and $workers .rank0_only) }}
  - name: {{ .name | quote }}
    mountPath: {{ .mount_path | quote }}
    {{- with .sub_path }}
    subPath: {{ . | quote }}
    {{- end }}
    {{- if .read_only }}
    readOnly: true
    {{- end }}
  {{- end }}
  {{- end }}
  {{- include "ddpjob.workdirMounts" . | nindent 2 }}
{{- end }}

{{/* The volumes behind them. */}}
{{- define "ddpjob.volumes" -}}
{{- $workers := .workers | default false }}
volumes:
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ .Values.shm_size | toString | quote }}
  - name: tmp
    emptyDir: {}
  {{- range .Values.volumes }}
  {{- if not (and $workers .rank0_only) }}
  - name: {{ .name | quote }}
    persistentVolumeClaim:
      claimName: {{ .claim | quote }}
  {{- end }}
  {{- end }}
  {{- include "ddpjob.workdirVolumes" . | nindent 2 }}
{{- end }}

{{/*
The PyTorchJob's pod template, shared by the Master and Worker replicas: one container named
`pytorch` (the operator finds it by name) with the port `pytorchjob-port`.
*/}}
{{- define "ddpjob.podTemplate" -}}
metadata:
  {{- include "ddpjob.podMetadata" . | nindent 2 }}
spec:
  {{- include "ddpjob.podFields" . | nindent 2 }}
  containers:
    - name: pytorch
      image: {{ .Values.image | quote }}
      command:
        {{- include "ddpjob.command" . | nindent 8 }}
      {{- with .Values.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      env:
        {{- include "ddpjob.envEntries" . | nindent 8 }}
      ports:
        - name: pytorchjob-port
          containerPort: 23456
      resources:
        {{- include "ddpjob.resources" . | nindent 8 }}
      {{- include "ddpjob.containerSecurityContext" . | nindent 6 }}
      {{- include "ddpjob.volumeMounts" . | nindent 6 }}
  {{- include "ddpjob.volumes" . | nindent 2 }}
{{- end }}
