class SubtitleStream: pass
