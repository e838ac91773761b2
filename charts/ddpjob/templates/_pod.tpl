{{/*
The pod template shared by the Master and Worker replicas: one container named `pytorch` (the
operator finds it by name) with the port `pytorchjob-port`, the restricted Pod Security profile,
a memory-backed /dev/shm and a writable /tmp for the non-root user, and the PVC mounts.
*/}}
{{- define "ddpjob.podTemplate" -}}
metadata:
  labels:
    {{- include "ddpjob.labels" . | nindent 4 }}
    {{- with .Values.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with .Values.service_account }}
  serviceAccountName: {{ . | quote }}
  {{- end }}
  {{- with .Values.priority_class }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- if kindIs "map" .Values.gang }}
  {{- with .Values.gang.scheduler_name }}
  schedulerName: {{ . | quote }}
  {{- end }}
  {{- end }}
  {{- with .Values.node_selector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
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
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 1000
    fsGroup: 1000
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: pytorch
      image: {{ .Values.image | quote }}
      command:
        {{- toYaml .Values.command | nindent 8 }}
      {{- with .Values.args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if or .Values.env .Values.secret_env }}
      env:
        {{- range .Values.env }}
        - name: {{ .name | quote }}
          value: {{ .value | toString | quote }}
        {{- end }}
        {{- range .Values.secret_env }}
        - name: {{ .name | quote }}
          valueFrom:
            secretKeyRef:
              name: {{ .secret | quote }}
              key: {{ .key | quote }}
        {{- end }}
      {{- end }}
      ports:
        - name: pytorchjob-port
          containerPort: 23456
      resources:
        limits:
          {{- if gt (.Values.resources.gpus | int) 0 }}
          nvidia.com/gpu: {{ .Values.resources.gpus | int }}
          {{- end }}
          cpu: {{ .Values.resources.cpu | toString | quote }}
          memory: {{ .Values.resources.memory | toString | quote }}
        requests:
          cpu: {{ .Values.resources.cpu | toString | quote }}
          memory: {{ .Values.resources.memory | toString | quote }}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
        runAsNonRoot: true
      volumeMounts:
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        {{- range .Values.volumes }}
        - name: {{ .name | quote }}
          mountPath: {{ .mount_path | quote }}
          {{- with .sub_path }}
          subPath: {{ . | quote }}
          {{- end }}
          {{- if .read_only }}
          readOnly: true
          {{- end }}
        {{- end }}
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ .Values.shm_size | toString | quote }}
    - name: tmp
      emptyDir: {}
    {{- range .Values.volumes }}
    - name: {{ .name | quote }}
      persistentVolumeClaim:
        claimName: {{ .claim | quote }}
    {{- end }}
{{- end }}
