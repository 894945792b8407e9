# Sourced by the figure scripts (plots/*.sh): from_data_option NAME [OPTION] sets from_data=1 for --from-data (draw
# from the committed plots/data/ alone; FIGURES=DIR draws elsewhere), 0 for no option, and exits 2 on anything else.
from_data_option() {
  case ${2:-} in
    --from-data) from_data=1 ;;
    "") from_data=0 ;;
    *) echo "$1: unknown option '$2' (use --from-data or nothing)" >&2; exit 2 ;;
  esac
}
