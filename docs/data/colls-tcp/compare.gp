set terminal pngcairo size 600,3840 font 'sans,10'
set output 'compare.png'
set multiplot layout 8,1 title 'busbw against size, median of 3 interleaved run(s)' font 'sans,12'
set logscale x 2
set logscale y 10
set format y '%g'
set grid xtics ytics lc rgb '#dddddd'
set xlabel 'size (bytes)'
set ylabel 'busbw (GB/s)'
set key outside below font 'sans,9' maxrows 3
set title 'allreduce, 4 ranks'
set xtics ('8' 8, '128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [5.333333333333333:12582912.0]
plot 'plot-data/allreduce-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allreduce-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'reduce, 4 ranks'
set xtics ('8' 8, '128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [5.333333333333333:12582912.0]
plot 'plot-data/reduce-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/reduce-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'broadcast, 4 ranks'
set xtics ('8' 8, '128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [5.333333333333333:12582912.0]
plot 'plot-data/broadcast-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/broadcast-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'allgather, 4 ranks'
set xtics ('128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [85.33333333333333:12582912.0]
plot 'plot-data/allgather-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/allgather-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'reducescatter, 4 ranks'
set xtics ('8' 8, '128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [5.333333333333333:12582912.0]
plot 'plot-data/reducescatter-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/reducescatter-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'alltoall, 4 ranks'
set xtics ('128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [85.33333333333333:12582912.0]
plot 'plot-data/alltoall-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/alltoall-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'gather, 4 ranks'
set xtics ('128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [85.33333333333333:12582912.0]
plot 'plot-data/gather-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/gather-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
set title 'scatter, 4 ranks'
set xtics ('128' 128, '2K' 2048, '32K' 32768, '512K' 524288, '8M' 8388608) rotate by -45
set xrange [85.33333333333333:12582912.0]
plot 'plot-data/scatter-n4-khor-tcp-auto.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.8 dt 1 lc rgb '#1f77b4' title 'khor tcp/auto', 'plot-data/scatter-n4-mpi-tcp.dat' using 1:2 with linespoints lw 2 pt 5 ps 0.8 dt 2 lc rgb '#d62728' title 'OpenMPI tcp'
unset multiplot
