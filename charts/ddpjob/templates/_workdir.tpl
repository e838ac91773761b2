{{/*
A shipped working directory (values.workdir, what `render --values` packed), in the pieces
controller/render/workdir.py adds to the job: its annotations, the command that unpacks it
before the user's (in the training container of both APIs), the env, the mounts and volumes.
Every piece is empty without a workdir.
*/}}

{{/* The job's annotations: the user's, then which code it runs. */}}
{{- define "ddpjob.jobAnnotations" -}}
{{- $notes := deepCopy .Values.annotations }}
{{- with .Values.workdir }}
{{- $_ := set $notes "ddpjob/workdir-digest" .digest }}
{{- with .git_commit }}
{{- $_ := set $notes "ddpjob/workdir-git-commit" . }}
{{- end }}
{{- with .git_dirty }}
{{- $_ := set $notes "ddpjob/workdir-git-dirty" . }}
{{- end }}
{{- end }}
{{- with $notes }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The container's command: python -m trainer.workdir SOURCE --digest D --into /workdir -- then
the command (a list body); the command alone without a workdir.
*/}}
{{- define "ddpjob.command" -}}
{{- if .Values.workdir }}
{{- include "ddpjob.workdirFetch" . }}
- "--"
{{ end }}
{{- toYaml .Values.command }}
{{- end }}

{{- define "ddpjob.workdirFetch" -}}
- python
- -m
- trainer.workdir
- {{ .Values.workdir.url | default "/var/run/ddpjob/workdir/workdir.tar.gz" | quote }}
- --digest
- {{ .Values.workdir.digest | quote }}
- --into
- /workdir
{{- end }}

{{/* After the env entries: PYTHONPATH (unless the user's carries it) and DDPJOB_WORKDIR_*. */}}
{{- define "ddpjob.workdirEnv" -}}
{{- with .Values.workdir }}
{{- $own := false }}
{{- range $.Values.env }}
{{- if eq .name "PYTHONPATH" }}{{ $own = true }}{{ end }}
{{- end }}
{{- if not $own }}
- name: PYTHONPATH
  value: /workdir
{{- end }}
- name: DDPJOB_WORKDIR_DIGEST
  value: {{ .digest | quote }}
{{- with .git_commit }}
- name: DDPJOB_WORKDIR_COMMIT
  value: {{ . | quote }}
{{- end }}
{{- with .git_dirty }}
- name: DDPJOB_WORKDIR_DIRTY
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The emptyDir at /workdir, and the ConfigMap's file, read-only. */}}
{{- define "ddpjob.workdirMounts" -}}
{{- if .Values.workdir }}
- name: workdir
  mountPath: /workdir
{{- if .Values.workdir.config_map }}
- name: workdir-archive
  mountPath: /var/run/ddpjob/workdir
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "ddpjob.workdirVolumes" -}}
{{- with .Values.workdir }}
- name: workdir
  emptyDir: {}
{{- with .config_map }}
- name: workdir-archive
  configMap:
    name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
