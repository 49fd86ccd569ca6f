# bash completion for sbx
_sbx_ids() {
  # only from a daemon that runs: completing never starts one
  local sock="${SBX_RUNTIME_DIR:-${XDG_RUNTIME_DIR:+$XDG_RUNTIME_DIR/sbx}}"
  [ "$(id -u)" = 0 ] && sock="${SBX_RUNTIME_DIR:-/run/sbx}"
  [ -S "$sock/sbx.sock" ] || return 0
  sbx ls 2>/dev/null | awk 'NR > 1 { print $1 }'
}

_sbx() {
  local cur prev cmd
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD-1]}"
  cmd="${COMP_WORDS[1]}"
  local cmds="mcp daemon exec ps logs kill session ls create destroy cp expose unexpose doctor mount umount help --version"
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "$cmds" -- "$cur"))
    return
  fi
  case "$prev" in
    -s|--sandbox) COMPREPLY=($(compgen -W "$(_sbx_ids)" -- "$cur")); return ;;
    --cwd|--mount) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --session|--timeout|-e|--env|--http|--tools|--allow|--memory|--cpus|--pids|--disk|--sleep-after|--image) return ;;
    --network) COMPREPLY=($(compgen -W "none egress" -- "$cur")); return ;;
  esac
  case "$cmd" in
    help) COMPREPLY=($(compgen -W "$cmds" -- "$cur")) ;;
    mcp) COMPREPLY=($(compgen -W "--sandbox --tools --read-only --help" -- "$cur")) ;;
    daemon) COMPREPLY=($(compgen -W "stop --http --http-allow-remote --mount --help" -- "$cur")) ;;
    exec) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "-s --sandbox -i -d --detach --session --cwd --timeout -e --help --" -- "$cur")) ;;
    ps) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "-s --sandbox --help" -- "$cur")) ;;
    logs) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "-s --sandbox -f --follow --help" -- "$cur")) ;;
    kill) [[ "$prev" == --signal ]] && COMPREPLY=($(compgen -W "SIGTERM SIGKILL SIGINT SIGHUP SIGQUIT SIGUSR1 SIGUSR2" -- "$cur")) ||
          { [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "-s --sandbox --signal --help" -- "$cur")); } ;;
    session)
      if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "-s --sandbox --cwd -e --help" -- "$cur"))
      else COMPREPLY=($(compgen -W "ls create rm" -- "$cur")); fi ;;
    create) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "--network --allow --memory --cpus --pids --disk --sleep-after --keep-alive --image -e --help" -- "$cur")) ;;
    destroy|expose|unexpose) COMPREPLY=($(compgen -W "$(_sbx_ids)" -- "$cur")) ;;
    cp) COMPREPLY=($(compgen -f -- "$cur") $(compgen -W "$(_sbx_ids | sed 's/$/:/')" -- "$cur")); compopt -o nospace 2>/dev/null ;;
    mount) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "-f -o --help" -- "$cur")) || COMPREPLY=($(compgen -d -- "$cur")) ;;
    umount) COMPREPLY=($(compgen -d -- "$cur")) ;;
  esac
}
complete -F _sbx sbx
